"""Where a cold prompt's time to first token goes through the API, from a timing_hook log and the
client's request times:

    python -m patchbay.measure.tools.timeline DIR [--warmup 2] [--out DIR/table.md]

DIR/hook.tsv: timing_hook's lines; DIR/client-times.tsv: each request's send, first-token and end
wall-clock seconds (client.py cold). The first --warmup requests are left out (the first one
captures the prompt's CUDA graph). The table: for each mark, its median time after the client sent
the request, and the time since the mark before. Replaces W09's api-ttft-timeline/timeline.py.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from patchbay.measure.tools import record
from patchbay.measure.windows import read_text

# (label, the hooked call, which end of it: 0 its start, 1 its end)
MARKS = [("HTTP in: the handler starts", "chat_completion.ChatCompletionHandler.handle_request", 0),
         ("chat template and tokenization done",
          "tokenization_utils_base.PreTrainedTokenizerBase.apply_chat_template", 1),
         ("request handed to the batching loop", "continuous_api.ContinuousBatchingManager.add_request", 1),
         ("the prompt's step launched", "continuous_api.ContinuousBatchingManager._generation_step", 0)]
# the prompt's step is done when its tokens are back on the host: the longest update_batch
STEP_DONE = ("the prompt's step done (its token on the host)", "continuous_api.ContinuousBatchProcessor.update_batch")
FIRST = "first token at the client"


@dataclass(frozen=True)
class Call:
    start: float
    end: float
    name: str
    wall_ms: float
    cpu_ms: float
    thread: str
    depth: int


def read_hook(text: str) -> list[Call]:
    """timing_hook's lines (end, thread, name, wall ms, CPU ms, depth) as calls."""
    calls = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) != 6:
            continue
        end, thread, name, wall, cpu, depth = fields
        calls.append(Call(float(end) - float(wall) / 1000, float(end), name, float(wall), float(cpu), thread,
                          int(depth)))
    return calls


def read_requests(text: str) -> list[tuple[float, float, float]]:
    return [tuple(map(float, line.split())) for line in text.splitlines() if line.strip()]


def marks(calls: list[Call], send: float, first: float) -> list[float | None]:
    """ms after `send` of each mark of one request (None where its call is not in the log)."""
    mine = sorted((c for c in calls if send - 0.001 <= c.start <= first + 0.001), key=lambda c: c.start)
    row: list[float | None] = []
    for _label, name, which in MARKS:
        hit = next((c for c in mine if c.name == name), None)
        row.append(None if hit is None else ((hit.start, hit.end)[which] - send) * 1000)
    waits = [c for c in mine if c.name == STEP_DONE[1]]
    row.append((max(waits, key=lambda c: c.wall_ms).end - send) * 1000 if waits else None)
    row.append((first - send) * 1000)
    return row


def table(calls: list[Call], requests: list[tuple[float, float, float]], warmup: int = 2) -> str:
    rows = [marks(calls, send, first) for send, first, _end in requests[warmup:]]
    labels = [m[0] for m in MARKS] + [STEP_DONE[0], FIRST]
    lines = [f"| ms after the client sent the request (median of {len(rows)}) | at | since the previous mark |",
             "|---|---:|---:|"]
    previous = 0.0
    for i, label in enumerate(labels):
        values = [r[i] for r in rows if r[i] is not None]
        if not values:
            lines.append(f"| {label} | - | - |")
            continue
        at = statistics.median(values)
        lines.append(f"| {label} | {at:.1f} | {at - previous:.1f} |")
        previous = at
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m patchbay.measure.tools.timeline", description=__doc__.split("\n")[0])
    p.add_argument("folder", type=Path, help="holds hook.tsv and client-times.tsv")
    p.add_argument("--warmup", type=int, default=2, help="requests left out at the start (default: %(default)s)")
    p.add_argument("--out", type=Path, help="write the table here (and a command.txt line beside it)")
    args = p.parse_args(argv)
    try:
        calls = read_hook(read_text(args.folder / "hook.tsv"))  # or hook.tsv.gz in a committed window
        requests = read_requests(read_text(args.folder / "client-times.tsv"))
    except OSError as e:
        print(f"timeline: {e}", file=sys.stderr)
        return 2
    text = table(calls, requests, args.warmup)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
        record.write_command(args.out.parent, "timeline", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())

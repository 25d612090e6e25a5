"""Where a window's passes waited: each pass of raw.jsonl against the Triton compiles and CUDA-graph
captures its arm's server (rank 0) logged meanwhile.

    python -m patchbay.measure.tools.stalls PART [--out PART/stalls.md]

PART holds raw.jsonl (or raw.jsonl.gz) and config.json (a results window, from `gpu.py ab`), epoch.txt (client.py
epoch: bench.run's clock at its start) and events/ (stall_hook.py's ev-PID-rRANK.tsv, one per
process). Each server's rank-0 file is matched to an arm by the port in its start line: arm A's is
config.json's url, arm B's its b_server url. Replaces W15's compile-stalls-tp2-api/stalls.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from patchbay.measure.tools import record
from patchbay.measure.windows import read_raw, read_text


@dataclass(frozen=True)
class Event:
    t: float  # start, monotonic seconds
    duration: float
    kind: str
    name: str


def read_events(text: str) -> list[Event]:
    out = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) == 4:
            out.append(Event(float(fields[0]), float(fields[1]), fields[2], fields[3]))
    return out


def read_epoch(text: str) -> float:
    """`EPOCH 173.747257` -> 173.747257."""
    words = text.split()
    if len(words) < 2 or words[0] != "EPOCH":
        raise ValueError(f"expected 'EPOCH <seconds>', got {text[:40]!r}")
    return float(words[1])


def arm_ports(config: dict) -> dict[int, str]:
    """{port: arm} from a window's config.json."""
    ports = {urlparse(config["url"]).port: "A"}
    b = config.get("b_server") or {}
    if b.get("url"):
        ports[urlparse(b["url"]).port] = "B"
    return ports


def server_events(folder: Path, ports: dict[int, str]) -> dict[str, list[Event]]:
    """Each arm's rank-0 events (a server's start line names its --port)."""
    out: dict[str, list[Event]] = {}
    for path in sorted({p.with_name(p.name.removesuffix(".gz")) for p in folder.glob("ev-*-r0.tsv*")}):
        events = read_events(read_text(path))  # ev-*.tsv.gz in a committed window
        start = next((e for e in events if e.kind == "start"), None)
        port = re.search(r"--port[ =](\d+)", start.name) if start else None
        arm = ports.get(int(port.group(1))) if port else None
        if arm is not None:
            out[arm] = events
    return out


def passes(rows: list[dict]) -> dict[tuple, list[dict]]:
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["rep"], r["concurrency"], r["arm"])].append(r)
    return by


def table(rows: list[dict], epoch: float, events: dict[str, list[Event]], lead: float = 0.5) -> str:
    """One line per pass, in the order run: its first tokens and the compiles and captures its arm's
    server logged from `lead` s before the pass began until its last token."""
    lines = ["| pass (rep, C, arm) | failed | TTFT median / max, ms | Triton compiles in the arm's rank 0: n, s "
             "| kernels | graph captures: n, s |", "|---|---:|---:|---:|---|---:|"]
    by = passes(rows)
    for key in sorted(by, key=lambda k: min(r["t_start"] for r in by[k])):
        rs = by[key]
        t0 = epoch + min(r["t_start"] for r in rs)
        t1 = epoch + max((r["t_last"] or r["t_start"]) for r in rs)
        ttft = sorted((r["t_first"] - r["t_start"]) * 1e3 for r in rs if r["t_first"] is not None)
        failed = sum(1 for r in rs if r["error"])
        ev = [e for e in events.get(key[2], []) if t0 - lead <= e.t <= t1]
        tri = [e for e in ev if e.kind == "triton"]
        graphs = [e for e in ev if e.kind == "graph"]
        names = ", ".join(sorted({e.name.split()[0] for e in tri})) or "-"
        rep = "warm-up" if key[0] < 0 else str(key[0])
        first = f"{ttft[len(ttft) // 2]:.0f} / {ttft[-1]:.0f}" if ttft else "- / -"
        lines.append(f"| {rep}, C{key[1]}, {key[2]} | {failed} | {first} | "
                     f"{len(tri)}, {sum(e.duration for e in tri):.2f} | {names} | "
                     f"{len(graphs)}, {sum(e.duration for e in graphs):.2f} |")
    return "\n".join(lines) + "\n"


def render(part: Path) -> str:
    rows = read_raw(part)
    epoch = read_epoch((part / "epoch.txt").read_text())
    ports = arm_ports(json.loads((part / "config.json").read_text()))
    return table(rows, epoch, server_events(part / "events", ports))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m patchbay.measure.tools.stalls", description=__doc__.split("\n")[0])
    p.add_argument("part", type=Path)
    p.add_argument("--out", type=Path, help="write the table here (and a command.txt line beside it)")
    args = p.parse_args(argv)
    try:
        text = render(args.part)
    except (OSError, ValueError, KeyError) as e:
        print(f"stalls: {args.part}: {e}", file=sys.stderr)
        return 2
    print(text, end="")
    if args.out:
        args.out.write_text(text)
        record.write_command(args.out.parent, "stalls", argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a cold 8K prompt's time to first token goes through the API: python timeline.py [DIR].

hook.tsv has one line per timed engine call (end wall-clock time, thread, name, wall ms, thread-CPU
ms, depth), written by timing_hook.py (a sitecustomize module on the server's PYTHONPATH);
client-times.tsv has each request's send, first-token and end wall-clock times (client.py). The
first two requests are warm-up (the first captured the prompt's CUDA graph)."""

import statistics
import sys
from pathlib import Path

folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
events = []
for line in (folder / "hook.tsv").read_text().splitlines():
    end, _thread, name, wall, _cpu, _depth = line.split("\t")
    events.append((float(end) - float(wall) / 1000, float(end), name, float(wall)))
requests = [tuple(map(float, line.split())) for line in (folder / "client-times.tsv").read_text().splitlines()]

MARKS = [("HTTP in: the handler starts", "chat_completion.ChatCompletionHandler.handle_request", 0),
         ("chat template and tokenization done", "tokenization_utils_base.PreTrainedTokenizerBase.apply_chat_template", 1),
         ("request handed to the batching loop", "continuous_api.ContinuousBatchingManager.add_request", 1),
         ("the prompt's step launched", "continuous_api.ContinuousBatchingManager._generation_step", 0)]
rows = []
for send, first, _end in requests[2:]:
    mine = sorted(e for e in events if send - 0.001 <= e[0] <= first + 0.001)
    row = []
    for _label, name, which in MARKS:
        hits = [e for e in mine if e[2] == name]
        row.append((hits[0][which] - send) * 1000)
    waits = [e for e in mine if e[2] == "continuous_api.ContinuousBatchProcessor.update_batch"]
    row.append((max(waits, key=lambda e: e[3])[1] - send) * 1000)  # the step's tokens are back on the host
    row.append((first - send) * 1000)
    rows.append(row)
labels = [m[0] for m in MARKS] + ["the prompt's step done (its token on the host)", "first token at the client"]
print("| ms after the client sent the request (median of %d) | at | since the previous mark |" % len(rows))
print("|---|---:|---:|")
previous = 0.0
for i, label in enumerate(labels):
    at = statistics.median(r[i] for r in rows)
    print(f"| {label} | {at:.1f} | {at - previous:.1f} |")
    previous = at

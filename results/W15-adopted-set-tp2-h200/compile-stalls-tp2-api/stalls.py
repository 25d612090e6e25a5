"""Where the C8/C32 passes' first tokens waited: each pass of raw.jsonl against the Triton compiles
and CUDA-graph captures its server logged meanwhile (events/, written by stall_hook.py as
sitecustomize in every process; the client printed its monotonic epoch to epoch.txt).

    python3 stalls.py [PART] > PART/stalls.md    (PART: a folder laid out like this one; default: this one)
"""
import collections
import glob
import json
import os
import sys

HERE = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
epoch = float(open(os.path.join(HERE, "epoch.txt")).read().split()[1])
rows = [json.loads(line) for line in open(os.path.join(HERE, "raw.jsonl"))]
passes = collections.defaultdict(list)
for r in rows:
    passes[(r["rep"], r["concurrency"], r["arm"])].append(r)

# rank 0 of each server: port 8071 is arm A, 8072 arm B
events = {}
for path in glob.glob(os.path.join(HERE, "events", "ev-*-r0.tsv")):
    lines = [line.rstrip("\n").split("\t") for line in open(path)]
    arm = "A" if "--port 8071" in lines[0][3] else "B"
    events[arm] = [(float(t), float(d), kind, name) for t, d, kind, name in lines]

print("| pass (rep, C, arm) | failed | TTFT median / max, ms | Triton compiles in the arm's rank 0: n, s | kernels | graph captures: n, s |")
print("|---|---:|---:|---:|---|---:|")
for key in sorted(passes, key=lambda k: min(r["t_start"] for r in passes[k])):
    rs = passes[key]
    t0 = epoch + min(r["t_start"] for r in rs)
    t1 = epoch + max((r["t_last"] or r["t_start"]) for r in rs)
    ttft = sorted((r["t_first"] - r["t_start"]) * 1e3 for r in rs if r["t_first"] is not None)
    failed = sum(1 for r in rs if r["error"])
    ev = [e for e in events[key[2]] if t0 - 0.5 <= e[0] <= t1]
    tri = [e for e in ev if e[2] == "triton"]
    gr = [e for e in ev if e[2] == "graph"]
    names = ", ".join(sorted({e[3].split()[0] for e in tri})) or "-"
    rep = "warm-up" if key[0] < 0 else str(key[0])
    print(f"| {rep}, C{key[1]}, {key[2]} | {failed} | {ttft[len(ttft) // 2]:.0f} / {ttft[-1]:.0f} | "
          f"{len(tri)}, {sum(e[1] for e in tri):.2f} | {names} | {len(gr)}, {sum(e[1] for e in gr):.2f} |")

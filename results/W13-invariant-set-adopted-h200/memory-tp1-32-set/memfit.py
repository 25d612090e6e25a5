"""Does air12 fit with a KV pool for 32 x 8K tokens? One server (argv[3] ranks, the knobs in argv[2]
as JSON, CUDA graphs, 1024 pages of 256 tokens = 262,144 tokens), argv[4] cold ~8K-token prompts
in flight at once (64-token replies), GPU memory sampled by nvidia-smi every 0.2 s (GPU 0).
Writes argv[1]/memfit.json."""
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from patchbay import bench, gpu

out, env, TP, STREAMS = Path(sys.argv[1]), json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
out.mkdir(parents=True, exist_ok=True)
PAGES, PROMPT = 1024, 8100


def used_mib() -> list[int]:
    q = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                       capture_output=True, text=True).stdout.split("\n")[0]
    return [int(x) for x in q.split(",")]


samples, stop = [], threading.Event()


def sample():
    while not stop.is_set():
        samples.append((time.time(), used_mib()[0]))
        time.sleep(0.2)


procs = gpu.start_serving("/tmp/air12", TP, 8300, env, out / "logs", True, PAGES)
try:
    url = "http://127.0.0.1:8300"
    idle, total = used_mib()
    info, chosen = bench.prepare(url, None, ["prefill"], PROMPT, cold=True)
    plan = bench.Plan(url=url, model=info["model"], arms={"A": {}, "B": {}}, prompts=chosen, levels=[STREAMS],
                      reps=1, warmup=0, max_tokens=64, cold=True, timeout=300)
    threading.Thread(target=sample, daemon=True).start()
    t0 = time.perf_counter()
    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=64)) as client, ThreadPoolExecutor(STREAMS) as pool:
        recs = list(pool.map(lambda _: bench.run_request(client, plan, bench.request_body(plan, chosen[0], "A"), t0),
                             range(STREAMS)))
    wall = time.perf_counter() - t0
    stop.set()
    peak = max(m for _, m in samples)
    report = {"tp": TP, "pages": PAGES, "pool_tokens": PAGES * 256, "streams": STREAMS,
              "ok": sum(r["error"] is None for r in recs), "errors": [r["error"] for r in recs if r["error"]][:3],
              "prompt_tokens": sorted({r["prompt_tokens"] for r in recs if r["prompt_tokens"]}),
              "completion_tokens": sum(r["completion_tokens"] or 0 for r in recs),
              "in_flight_prompt_tokens": sum(r["prompt_tokens"] or 0 for r in recs),
              "wall_s": round(wall, 2), "ttft_s": sorted(round(r["t_first"], 3) for r in recs if r["t_first"]),
              "gpu_mib_total": total, "gpu_mib_used_ready": idle, "gpu_mib_used_peak": peak,
              "gpu_mib_headroom": total - peak, "samples": len(samples)}
    (out / "memfit.json").write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "ttft_s"}))
finally:
    for p in procs:
        gpu.stop_server(p)

"""0930 PB_DECODE_GRAPHS served: servers in turn (production on one GPU, host tier off) without and
with the knob, each: C64 agent greedy (distinct 600-token prompts, 256-token replies), 1 warm-up
pass and 2 measured, then C128 (128-token replies) the same; pb_cuda_graphs read before and after
each level. argv: OUT seconds"""
import json, re, subprocess, sys, time
from pathlib import Path

import httpx

from patchbay.device.gpu import parse_env
from patchbay.device.servers import start_serving, with_servers

out, budget = Path(sys.argv[1]), float(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
t0 = time.monotonic()
el = lambda: time.monotonic() - t0
prod = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0}', "env")


def graphs(url):
    m = re.search(r"^pb_cuda_graphs\S* (\S+)$", httpx.get(url + "/metrics", timeout=30).text, re.M)
    return float(m.group(1)) if m else None


import torch

if torch.cuda.get_device_properties(0).total_memory > 120e9:  # an H200: both servers side by side, paired passes
    env = '@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0%s}'
    rc = subprocess.call(
        [sys.executable, "-m", "patchbay.device", "ab", "--cuda-graphs", "--a-env", env % "", "--b-env",
         env % ',"PB_DECODE_GRAPHS":1', "--num-blocks", "512", "--logs", str(out / "logs"), "--",
         "--workload", "agent", "--modes", "greedy", "--concurrency", "64,128", "--requests", "1",
         "--prompt-tokens", "600", "--max-tokens", "192", "--reps", "2", "--warmup", "1",
         "--time-limit", str(int(budget - el() - 100)), "--results-dir", str(out), "--window", "dg-paired"],
        stdout=(out / "paired.txt").open("w"), stderr=subprocess.STDOUT)
    print("paired rc", rc, f"at {el():.0f} s", flush=True)
    sys.exit(0)

ARMS = [("off", {}), ("on", {"PB_DECODE_GRAPHS": "1"})]
if len(sys.argv) > 3 and sys.argv[3] == "reverse":
    ARMS.reverse()
LEVELS = [("c64", "64", "256", 120), ("c128", "128", "128", 100)]
for folder, extra in ARMS:
    if budget - el() < 120:
        print(folder, "skipped: time", f"{el():.0f} s", flush=True)
        continue

    def job(procs, folder=folder, extra=extra):
        (out / folder).mkdir(parents=True, exist_ok=True)
        procs += start_serving(None, 1, 8000, {**prod, **extra}, out / folder / "server", True, 512)
        url = "http://127.0.0.1:8000"
        counts = {"ready": graphs(url)}
        print(folder, f"ready at {el():.0f} s", counts, flush=True)
        for window, c, tokens, limit in LEVELS:
            left = budget - el() - 10
            if left < 40:
                break
            rc = subprocess.call(
                [sys.executable, "-m", "patchbay", "ab", "--url", url, "--model", "synthetic:air12", "--workload",
                 "agent", "--modes", "greedy", "--a-json", "{}", "--b-json", "{}", "--concurrency", c,
                 "--requests", "1", "--prompt-tokens", "600", "--max-tokens", tokens, "--reps", "1", "--warmup", "1",
                 "--time-limit", str(int(min(limit, left))), "--results-dir", str(out / folder), "--window", window],
                stdout=(out / folder / f"{window}.txt").open("w"), stderr=subprocess.STDOUT)
            counts[f"after-{window}"] = graphs(url)
            print(folder, window, "rc", rc, f"at {el():.0f} s", counts, flush=True)
        (out / folder / "graphs.json").write_text(json.dumps(counts, indent=1))
        return 0

    print(folder, "rc", with_servers(job), f"at {el():.0f} s", flush=True)

"""Issue 27 / 0850 on one GPU: air12 with an automatically sized pool (no --cb-num-blocks), the
production set on one GPU with PB_KV_SIZING on (B) and then off (A). Each: /metrics memory gauges,
C128 agent greedy (600-token prompts, 96-token replies), then a 120K-token prompt sent while 32
streams decode (two `ab` processes at once), gauges again. argv: OUT seconds"""
import json, os, re, subprocess, sys, time
from pathlib import Path

import httpx

from patchbay.device.gpu import parse_env
from patchbay.device.servers import with_server

out, budget = Path(sys.argv[1]), float(sys.argv[2])
t0 = time.monotonic()
MODEL = "synthetic:air12"
BASE = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}


def mem(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(pb_gpu_memory_\w+|pb_kv_blocks_total)\{?[^ ]*\}? (\S+)$", text, re.M)}


def ab(url, arm, window, *args, limit):
    return subprocess.Popen([sys.executable, "-m", "patchbay", "ab", "--url", url, "--model", MODEL, "--workload",
                             "agent", "--reps", "1", "--warmup", "0", "--time-limit", str(int(limit)),
                             "--results-dir", str(out / arm), "--window", window, *args],
                            stdout=(out / arm / f"{window}.txt").open("w"), stderr=subprocess.STDOUT)


def arm_job(arm):
    def job(url):
        (out / arm).mkdir(parents=True, exist_ok=True)
        snaps = {"start": mem(url)}
        left = budget - (time.monotonic() - t0)
        p = ab(url, arm, "c128", "--modes", "greedy", "--concurrency", "128", "--requests", "1", "--max-tokens",
               "96", "--prompt-tokens", "600", limit=min(90, left / 3))
        print(arm, "c128 rc", p.wait(), f"at {time.monotonic() - t0:.0f} s", flush=True)
        snaps["after-c128"] = mem(url)
        left = budget - (time.monotonic() - t0)
        streams = ab(url, arm, "c32-beside", "--modes", "greedy", "--concurrency", "32", "--requests", "4",
                     "--max-tokens", "256", "--prompt-tokens", "600", limit=min(120, left - 20))
        time.sleep(15)
        long = ab(url, arm, "long-120k", "--modes", "greedy", "--concurrency", "1", "--requests", "1",
                  "--max-tokens", "64", "--prompt-tokens", "120000", limit=min(120, left - 20))
        print(arm, "long rc", long.wait(), "streams rc", streams.wait(), f"at {time.monotonic() - t0:.0f} s",
              flush=True)
        snaps["after-long"] = mem(url)
        (out / arm / "mem.json").write_text(json.dumps(snaps, indent=1))
        print(arm, json.dumps(snaps), flush=True)
        return 0
    return job


for arm, extra in (("B-sizing", {"PB_KV_SIZING": "1"}), ("A-upstream-sizing", {})):
    if budget - (time.monotonic() - t0) < 200:
        print(arm, "skipped: time", flush=True)
        continue
    env = {**BASE, **parse_env('@prod+{"PB_TENSOR_PARALLEL":0}', "env"), **extra}
    with_server(True, 8000, arm_job(arm), log=out / f"server-{arm}.log", env=env, num_blocks=None,
                model_name=MODEL)

"""Call 2. 0850 PB_KV_SIZING under C128, paired: air12 with an automatic pool, production on one
GPU, sizing on / off / on / off (a server each), each C128 agent greedy (600-token prompts,
96-token replies, 1 warm-up pass and 2 measured), memory gauges and allocator retries before and
after. argv: OUT seconds"""
import json, os, re, subprocess, sys, time
from pathlib import Path

import httpx

from patchbay.device.gpu import parse_env
from patchbay.device.servers import with_server

out, budget = Path(sys.argv[1]), float(sys.argv[2])
t0 = time.monotonic()
MODEL = "synthetic:air12"
BASE = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}


def el():
    return time.monotonic() - t0


def mem(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1) + (m.group(2) or ""): float(m.group(3)) for m in re.finditer(
        r"^(pb_gpu_memory_\w+|pb_kv_blocks_total)(\{[^ ]*\})? (\S+)$", text, re.M)}


def arm_job(arm):
    def job(url):
        (out / arm).mkdir(parents=True, exist_ok=True)
        snaps = {"start": mem(url)}
        p = subprocess.run([sys.executable, "-m", "patchbay", "ab", "--url", url, "--model", MODEL, "--workload",
                            "agent", "--reps", "2", "--warmup", "1", "--time-limit", "80", "--results-dir",
                            str(out / arm), "--window", "c128", "--modes", "greedy", "--concurrency", "128",
                            "--requests", "1", "--max-tokens", "96", "--prompt-tokens", "600"],
                           stdout=(out / arm / "c128.txt").open("w"), stderr=subprocess.STDOUT)
        snaps["end"] = mem(url)
        (out / arm / "mem.json").write_text(json.dumps(snaps, indent=1))
        print(arm, "rc", p.returncode, json.dumps(snaps), f"at {el():.0f} s", flush=True)
        return 0
    return job


prod = parse_env('@prod+{"PB_TENSOR_PARALLEL":0}', "env")
for arm, extra in (("1-sizing", {"PB_KV_SIZING": "1"}), ("2-upstream", {}), ("3-sizing", {"PB_KV_SIZING": "1"}),
                   ("4-upstream", {})):
    if budget - el() < 120:
        print(arm, "skipped: time", flush=True)
        continue
    with_server(True, 8000, arm_job(arm), log=out / f"server-{arm}.log", env={**BASE, **prod, **extra},
                num_blocks=None, model_name=MODEL)

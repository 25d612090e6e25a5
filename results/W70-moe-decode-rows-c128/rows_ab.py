"""0910 PB_MOE_DECODE_ROWS through the API: air12, production on one GPU, servers in turn with the
knob unset / 16 / unset / 16; each C128 and C64 agent greedy (600-token prompts, 96-token replies, 1 request
a stream and pass, 1 warm-up pass and 2 measured). argv: OUT seconds"""
import os, subprocess, sys, time
from pathlib import Path

from patchbay.device.gpu import parse_env
from patchbay.device.servers import with_server

out, budget = Path(sys.argv[1]), float(sys.argv[2])
t0 = time.monotonic()
MODEL = "synthetic:air12"
BASE = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}


def el():
    return time.monotonic() - t0


def arm_job(arm):
    def job(url):
        (out / arm).mkdir(parents=True, exist_ok=True)
        p = subprocess.run([sys.executable, "-m", "patchbay", "ab", "--url", url, "--model", MODEL, "--workload",
                            "agent", "--reps", "2", "--warmup", "1", "--time-limit", "75", "--results-dir",
                            str(out / arm), "--window", "c128", "--modes", "greedy,sampled", "--concurrency", "128",
                            "--requests", "1", "--max-tokens", "96", "--prompt-tokens", "600"],
                           stdout=(out / arm / "c128.txt").open("w"), stderr=subprocess.STDOUT)
        print(arm, "rc", p.returncode, f"at {el():.0f} s", flush=True)
        return 0
    return job


prod = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0}', "env")
for arm, extra in (("1-rows16", {"PB_MOE_DECODE_ROWS": "16"}), ("2-off", {}), ("3-rows16", {"PB_MOE_DECODE_ROWS": "16"}),
                   ("4-off", {})):
    if budget - el() < 110:
        print(arm, "skipped: time", flush=True)
        continue
    with_server(True, 8000, arm_job(arm), log=out / f"server-{arm}.log", env={**BASE, **prod, **extra},
                num_blocks=None, model_name=MODEL)

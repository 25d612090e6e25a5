"""Call 1. (a) air12 drafting counters: one server, production on one GPU + PB_DRAFT_STREAMS=2,
PB_DRAFT_ASYNC=1, PB_DRAFT_BACKOFF=16; per request PB_DRAFT_TOKENS 0 vs 8, 2, 4 at C1 (greedy and
sampled), /metrics pb_draft_* before and after each. (b) 0880 PB_PREFILL_TURNS off then on: a
120K-token prompt sent while 32 streams decode (two ab processes). argv: OUT seconds"""
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


def counters(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r"^(pb_draft_\w+|pb_gpu_memory_\w+|pb_kv_blocks_total)\{?[^ ]*\}? (\S+)$", text, re.M)}


def ab(url, folder, window, *args, limit, reps="2", warmup="1"):
    (out / folder).mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", "patchbay", "ab", "--url", url, "--model", MODEL, "--workload",
                             "agent", "--reps", reps, "--warmup", warmup, "--time-limit", str(int(limit)),
                             "--results-dir", str(out / folder), "--window", window, *args],
                            stdout=(out / folder / f"{window}.txt").open("w"), stderr=subprocess.STDOUT)


def drafting(url):
    snaps = {"start": counters(url)}
    for k in ("8", "2", "4"):
        left = budget - el()
        if left < 380:
            print("draft", k, "skipped", flush=True)
            continue
        p = ab(url, "drafts", f"k{k}", "--modes", "greedy,sampled", "--knob", f"PB_DRAFT_TOKENS=0,{k}",
               "--concurrency", "1", "--requests", "4", "--prompt-tokens", "600", "--max-tokens", "128",
               limit=min(60, left - 330))
        print("draft", k, "rc", p.wait(), f"at {el():.0f} s", flush=True)
        snaps[f"after-k{k}"] = counters(url)
    (out / "drafts" / "counters.json").write_text(json.dumps(snaps, indent=1))
    return 0


def turns(arm):
    def job(url):
        snaps = {"start": counters(url)}
        left = budget - el()
        streams = ab(url, arm, "c32-beside", "--modes", "greedy", "--concurrency", "32", "--requests", "4",
                     "--max-tokens", "256", "--prompt-tokens", "600", limit=min(100, left - 20), reps="1", warmup="0")
        time.sleep(25)
        long = ab(url, arm, "long-120k", "--modes", "greedy", "--concurrency", "1", "--requests", "1",
                  "--max-tokens", "64", "--prompt-tokens", "120000", limit=min(85, left - 35), reps="1", warmup="0")
        print(arm, "long rc", long.wait(), "streams rc", streams.wait(), f"at {el():.0f} s", flush=True)
        snaps["end"] = counters(url)
        (out / arm / "counters.json").write_text(json.dumps(snaps, indent=1))
        return 0
    return job


prod = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0}', "env")
env = {**BASE, **prod, "PB_DRAFT_STREAMS": "2", "PB_DRAFT_ASYNC": "1", "PB_DRAFT_BACKOFF": "16"}
if os.environ.get("JOB_DRAFTS"):
    print("drafting rc", with_server(True, 8000, drafting, log=out / "server-drafts.log", env=env, num_blocks=256,
                                     model_name=MODEL), f"at {el():.0f} s", flush=True)
ARMS = (("turns-off", {}), ("turns-on", {"PB_PREFILL_TURNS": "1"}),
        ("turns-chunk", {"PB_PREFILL_TURNS": "1", "PB_PREFILL_CHUNK": "2048"}))
for arm, extra in ARMS if os.environ.get("JOB_TURNS") else ():
    if budget - el() < 150:
        print(arm, "skipped: time", flush=True)
        continue
    env = {**BASE, **prod, "PB_KV_SIZING": "1", **extra}
    print(arm, "rc", with_server(True, 8000, turns(arm), log=out / f"server-{arm}.log", env=env, num_blocks=None,
                                 model_name=MODEL), f"at {el():.0f} s", flush=True)

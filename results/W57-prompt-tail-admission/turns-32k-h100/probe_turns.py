"""One-off device run (issue 26): one production server (air12 in memory, CUDA graphs) of this build, whose
admission of a resent 32K conversation no longer sends the prompt's ids to the reply process and re-encodes
shorter pieces; PB_ENCODE_CACHE per request (A off, B on, as W46); a 32K conversation and replay, then cold
400-token prompts (the target's baseline). python3 devjob/probe_turns.py OUT"""
import os, shutil, subprocess, sys, time
from pathlib import Path
from patchbay.device.gpu import parse_env
from patchbay.device.servers import AIR12, start_serving, with_servers
from patchbay.measure.verbs import run

T0 = time.time()
out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
logs = Path("/tmp/probe-logs"); logs.mkdir(exist_ok=True)
env = parse_env("@prod", "B"); env.pop("PB_TENSOR_PARALLEL", None)

def job(procs):
    procs += start_serving(None, 1, 8000, env, logs / "server", True, 600)
    print("server up", round(time.time() - T0), flush=True)
    common = ["--url", "http://127.0.0.1:8000", "--model", AIR12, "--knob", "PB_ENCODE_CACHE=0,1", "--workload", "agent",
              "--concurrency", "1", "--max-tokens", "16", "--warmup", "1", "--results-dir", str(out / "ab"), "--quiet"]
    rc = run("ab", common + ["--modes", "conversation,replay", "--prompt-tokens", "32000", "--turns", "4", "--reps", "5",
                             "--time-limit", "150", "--window", "turns-32k"])
    print("turns done", round(time.time() - T0), rc, flush=True)
    rc = run("ab", common + ["--modes", "greedy", "--prompt-tokens", "400", "--requests", "3", "--reps", "3",
                             "--time-limit", "60", "--window", "cold-400"]) or rc
    print("cold done", round(time.time() - T0), rc, flush=True)
    return rc

rc = with_servers(job)
subprocess.run(f"grep -h pb-request {logs}/server* > {out}/pb-request.log", shell=True)
sys.exit(rc)

"""Call 2, part 2: 0900 PB_DRAFT_PAYS on a GPU. Servers in turn, each the production set on one GPU
(host tier off) + PB_DRAFT_STREAMS=2, PB_DRAFT_ASYNC=1, PB_DRAFT_BACKOFF=16 and PB_DRAFT_PAYS 0 or 2;
arms per request (pb_knobs PB_DRAFT_TOKENS 0 = A against 8 = B), C1, /metrics pb_draft_* before/after.
air12 (random weights: drafts are kept about one in two) with agent greedy+sampled, then
synthetic:trained (copies: drafts pay) with edit and prose prompts. argv: OUT seconds"""
import json, os, re, subprocess, sys, time
from pathlib import Path

import httpx

from patchbay.device.gpu import parse_env
from patchbay.device.servers import start_serving, with_servers

out, budget = Path(sys.argv[1]), float(sys.argv[2])
t0 = time.monotonic()
el = lambda: time.monotonic() - t0
prod = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0}', "env")
DRAFT = {"PB_DRAFT_STREAMS": "2", "PB_DRAFT_ASYNC": "1", "PB_DRAFT_BACKOFF": "16"}


def counters(url):
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^(pb_draft_\w+)\{?[^ ]*\}? (\S+)$", text, re.M)}


def ab(url, model, folder, window, args, limit):
    (out / folder).mkdir(parents=True, exist_ok=True)
    return subprocess.call([sys.executable, "-m", "patchbay", "ab", "--url", url, "--model", model, "--workload",
                            "agent", "--reps", "2", "--warmup", "1", "--time-limit", str(int(limit)), "--knob",
                            "PB_DRAFT_TOKENS=0,8", "--concurrency", "1", "--prompt-tokens", "600",
                            "--results-dir", str(out / folder), "--window", window, *args],
                           stdout=(out / folder / f"{window}.txt").open("w"), stderr=subprocess.STDOUT)


ARMS = [  # (folder, model dir or None for air12, PAYS, runs: (window, args, seconds))
    ("air12-pays0", None, "0", [("air12", ["--modes", "greedy,sampled", "--requests", "4", "--max-tokens", "128"], 60)]),
    ("air12-pays2", None, "2", [("air12", ["--modes", "greedy,sampled", "--requests", "4", "--max-tokens", "128"], 60)]),
    ("trained-pays2", "/tmp/trained", "2", [
        ("edit", ["--tasks", "edit", "--modes", "greedy,sampled", "--requests", "4", "--max-tokens", "256"], 60),
        ("prose", ["--tasks", "prose", "--modes", "greedy,sampled", "--requests", "4", "--max-tokens", "256"], 50)]),
    ("trained-pays0", "/tmp/trained", "0", [
        ("edit", ["--tasks", "edit", "--modes", "greedy,sampled", "--requests", "4", "--max-tokens", "256"], 60),
        ("prose", ["--tasks", "prose", "--modes", "greedy,sampled", "--requests", "4", "--max-tokens", "256"], 50)]),
]
for folder, model_dir, pays, runs in ARMS:
    need = 40 + sum(r[2] for r in runs)
    if budget - el() < need:
        print(folder, "skipped: time", f"{el():.0f} s", flush=True)
        continue
    env = {**prod, **DRAFT, "PB_DRAFT_PAYS": pays}

    def job(procs, folder=folder, model_dir=model_dir, runs=runs, env=env):
        (out / folder).mkdir(parents=True, exist_ok=True)
        procs += start_serving(model_dir, 1, 8000, env, out / folder / "server", True, 256)
        url, model = "http://127.0.0.1:8000", model_dir or "synthetic:air12"
        snaps = {"start": counters(url)}
        print(folder, f"ready at {el():.0f} s", flush=True)
        for window, args, limit in runs:
            rc = ab(url, model, folder, window, args, min(limit, budget - el() - 15))
            snaps[f"after-{window}"] = counters(url)
            print(folder, window, "rc", rc, f"at {el():.0f} s", flush=True)
        (out / folder / "counters.json").write_text(json.dumps(snaps, indent=1))
        return 0

    print(folder, "rc", with_servers(job), f"at {el():.0f} s", flush=True)

"""synthetic:trained, production (A) against production + drafting with backoff (B), two servers,
several ab runs against them; then the servers stop. argv: OUT seconds"""
import json, subprocess, sys, time
from pathlib import Path
from patchbay.device.gpu import parse_env
from patchbay.device.servers import start_serving, with_servers
from patchbay.measure.verbs import run

out, budget = Path(sys.argv[1]), float(sys.argv[2])
t0 = time.monotonic()
A = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0}', "a")
B = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0,"PB_DRAFT_TOKENS":8,"PB_DRAFT_STREAMS":2,'
              '"PB_DRAFT_ASYNC":1,"PB_DRAFT_BACKOFF":16}', "b")
RUNS = [  # (window, args, seconds it may take)
    ("draft-backoff-edit", ["--tasks", "edit", "--modes", "greedy,sampled", "--concurrency", "1", "--requests", "6",
                            "--max-tokens", "256"], 100),
    ("draft-backoff-prose", ["--tasks", "prose", "--modes", "greedy,sampled", "--concurrency", "1", "--requests", "6",
                             "--max-tokens", "256"], 80),
    ("draft-backoff-modes", ["--modes", "greedy,sampled,json,tools-required", "--concurrency", "1,16",
                             "--requests", "4", "--max-tokens", "128"], 120),
]


def job(procs):
    for n, env in enumerate((A, B)):
        procs += start_serving("/tmp/trained", 1, 8000 + n, env, out / "logs" / f"server-{'AB'[n]}", True, 512,
                               rdzv_port=29600 + n)
    print(f"servers ready at {time.monotonic() - t0:.0f} s", flush=True)
    for window, args, limit in RUNS:
        left = budget - (time.monotonic() - t0)
        if left < 40:
            print(f"{window}: skipped, {left:.0f} s left", flush=True)
            continue
        lim = min(limit, left - 25)
        rc = run("ab", ["--url", "http://127.0.0.1:8000", "--b-url", "http://127.0.0.1:8001", "--model", "/tmp/trained",
                        "--workload", "agent", "--reps", "2", "--warmup", "1", "--prompt-tokens", "600",
                        "--time-limit", str(int(lim)), "--window", window, "--results-dir", str(out / "res"), *args])
        print(f"{window}: rc {rc} at {time.monotonic() - t0:.0f} s", flush=True)
    for port in (8000, 8001):
        try:
            import urllib.request
            (out / f"metrics-{port}.txt").write_text(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode())
        except Exception as e:
            print("metrics", port, e)
    return 0


sys.exit(with_servers(job))

"""One greedy count-suite request of N tokens at a time (C1 decode), REPS times; prints tok/s."""
import json
import sys
import time

import httpx

from patchbay import bench

url, n, reps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
info, chosen = bench.prepare(url, None, ["count"], None)
plan = bench.Plan(url=url, model=info["model"], arms={"A": {}, "B": {}}, prompts=chosen, levels=[1], reps=1,
                  warmup=0, max_tokens=n)
with httpx.Client(timeout=300) as client:
    for i in range(reps):
        body = bench.request_body(plan, chosen[0], "A", max_tokens=n)
        send, first, chunks = time.time(), None, 0
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    first = first or time.time()
        end = time.time()
        print(f"request {i}: {chunks} chunks, decode {(chunks - 1) / (end - first):.1f} chunks/s", flush=True)

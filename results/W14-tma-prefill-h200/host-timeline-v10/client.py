"""Cold ~8K-token chat requests, one at a time; writes 'send first end' wall-clock seconds per request."""
import json
import sys
import time

import httpx

from patchbay import bench

url, out, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
info, chosen = bench.prepare(url, None, ["prefill"], 8192, cold=True)
plan = bench.Plan(url=url, model=info["model"], arms={"A": {}, "B": {}}, prompts=chosen, levels=[1], reps=1,
                  warmup=0, max_tokens=4, cold=True)
with open(out, "w") as f, httpx.Client(timeout=120) as client:
    for i in range(n):
        body = bench.request_body(plan, chosen[0], "A")
        send, first = time.time(), None
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if first is None and line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    if any(bench._reply_text(c.get("delta") or {}) for c in chunk.get("choices") or []):
                        first = time.time()
        end = time.time()
        f.write(f"{send} {first or end} {end}\n")
        print(f"request {i}: ttft {1000 * ((first or end) - send):.1f} ms, total {1000 * (end - send):.1f} ms", flush=True)
        time.sleep(0.5)

"""Scratch: which setting makes drafted replies differ from serial ones on the GPU (synthetic:trained, bf16).
Each server drafts (PB_DRAFT_TOKENS=8 at start, so synchronous); requests send pb_knobs 0 or 8."""
import inspect, json, os, sys, textwrap, threading, time, http.client
from pathlib import Path
import httpx
from patchbay.device.gpu import parse_env
from patchbay.device.servers import start_ranks, stop_server

out = Path(os.environ["OUT"]) / "bisect"
model = "/tmp/trained"
prod = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_DRAFT_TOKENS":8}', "x")
prod["PB_HOST_TIER_MB"] = "0"
def without(*names, base=prod):
    return {k: v for k, v in base.items() if k not in names}
configs = {
    "prod-async": (without("PB_DRAFT_TOKENS"), True),
    "prod-graphs": (prod, True),
}
procs, ports, errors = {}, {}, {}

def start(i, name):
    env, graphs = configs[name]
    args = "--cb-num-blocks 64" + (" --cb-use-cuda-graph" if graphs else "")
    try:
        procs[name] = start_ranks(model, 1, 8000 + i, env, out / name, engine_args=args, rdzv_port=29600 + i,
                                  ready_timeout=150)
        ports[name] = 8000 + i
    except Exception as e:
        errors[name] = str(e)[:200] + " ... " + str(e)[-600:]

threads = [threading.Thread(target=start, args=(i, n)) for i, n in enumerate(configs)]
[t.start() for t in threads]; [t.join() for t in threads]
print("errors", json.dumps(errors, indent=1), flush=True)
src = Path("src/patchbay")
texts = [(src / f).read_text()[1500:2200] for f in ("cli.py", "device/servers.py", "runtime/launch.py", "measure/draft.py")]
result = {}
allr = {}
for name, port in ports.items():
    rows = []
    for n, text in enumerate(texts):
        for extra in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 11}):
            replies = []
            for k in ((0,) if name == "prod-async" else (0, 8)):
                body = {"model": model, "messages": [{"role": "user", "content": "Repeat this code:\n" + text}],
                        "max_tokens": 96, "ignore_eos": True, "pb_knobs": {"PB_DRAFT_TOKENS": k}, **extra}
                try:
                    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60)
                    replies.append(r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else f"HTTP {r.status_code} {r.text[:200]}")
                except Exception as e:
                    replies.append(f"{type(e).__name__}: {e}")
            replies = replies * (3 - len(replies)) if len(replies) == 1 else replies
            allr.setdefault((n, extra["temperature"]), {})[name] = replies
            same = replies[0] == replies[1]
            first = next((i for i, (a, b) in enumerate(zip(*replies)) if a != b), None)
            rows.append({"text": n, "mode": "greedy" if extra["temperature"] == 0 else "sampled", "same": same,
                         "first_diff_char": first, "a": replies[0][:120], "b": replies[1][:120]})
    try:
        metrics = [l for l in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text.splitlines()
                   if l.startswith("pb_draft")]
    except Exception as e:
        metrics = [str(e)]
    result[name] = {"same": sum(r["same"] for r in rows), "of": len(rows), "metrics": metrics, "rows": rows}
    print(name, result[name]["same"], "of", len(rows), metrics, flush=True)
cross = []
for key, by in allr.items():
    ref = by.get("prod-async", [None])[0]
    cross.append({"prompt": key, **{n: [r == ref for r in rs] for n, rs in by.items()}})
print("vs async (k0, k8):", json.dumps(cross), flush=True)
result["cross"] = cross
(out / "bisect.json").write_text(json.dumps({"errors": errors, "result": result}, indent=1))
for ps in procs.values():
    for p in ps:
        stop_server(p)

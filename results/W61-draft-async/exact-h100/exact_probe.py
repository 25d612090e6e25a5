"""0860 on one GPU: one server of synthetic:trained (bf16), the production set plus PB_DRAFT_ASYNC=1 and
PB_DRAFT_STREAMS=2, CUDA graphs; each of 4 code prompts greedy and seeded sampled with pb_knobs PB_DRAFT_TOKENS
0 and 8, alone, then the 8 requests of each setting at once (replies of 48-160 tokens, so the load falls through
the limit as they finish and the loop moves between waiting and overlapping). Every reply must equal its
PB_DRAFT_TOKENS=0 reply sent alone. python3 exact_probe.py OUT MODEL_DIR"""
import json, sys, threading
from pathlib import Path

import httpx

from patchbay.device.gpu import parse_env
from patchbay.device.servers import start_ranks, stop_server

out, model = Path(sys.argv[1]), sys.argv[2]
out.mkdir(parents=True, exist_ok=True)
env = parse_env('@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0,"PB_DRAFT_ASYNC":1,"PB_DRAFT_STREAMS":2}', "x")
procs = start_ranks(model, 1, 8000, env, out / "server", engine_args="--cb-num-blocks 128 --cb-use-cuda-graph",
                    rdzv_port=29600, ready_timeout=200)
src = Path("src/patchbay")
texts = [(src / f).read_text()[1500:2200] for f in ("cli.py", "device/servers.py", "runtime/launch.py",
                                                     "measure/draft.py")]
LENGTHS = (48, 96, 128, 160)


def body(n, sampled, k):
    extra = {"temperature": 0.8, "top_p": 0.95, "seed": 11 + n} if sampled else {"temperature": 0}
    return {"model": model, "messages": [{"role": "user", "content": "Repeat this code:\n" + texts[n]}],
            "max_tokens": LENGTHS[n], "ignore_eos": True, "pb_knobs": {"PB_DRAFT_TOKENS": k}, **extra}


def send(b):
    r = httpx.post("http://127.0.0.1:8000/v1/chat/completions", json=b, timeout=120)
    return r.json()["choices"][0]["message"]["content"] if r.status_code == 200 else f"HTTP {r.status_code} {r.text[:300]}"


def metrics():
    return {l.split()[0]: float(l.split()[1]) for l in httpx.get("http://127.0.0.1:8000/metrics", timeout=10).text.splitlines()
            if l.startswith("pb_draft")}


try:
    cases = [(n, s) for n in range(4) for s in (False, True)]
    ref = {c: send(body(*c, 0)) for c in cases}
    rows, counts = [], {"start": metrics()}
    for k in (8,):
        alone = {c: send(body(*c, k)) for c in cases}
        counts[f"alone-{k}"] = metrics()
        for rep in range(2):
            together = {}
            threads = [threading.Thread(target=lambda c=c: together.__setitem__(c, send(body(*c, k)))) for c in cases]
            [t.start() for t in threads]; [t.join() for t in threads]
            counts[f"together-{k}-{rep}"] = metrics()
            for c in cases:
                rows.append({"prompt": c[0], "sampled": c[1], "k": k, "rep": rep, "alone_equal": alone[c] == ref[c],
                             "together_equal": together[c] == ref[c], "ref": ref[c][:100], "alone": alone[c][:100],
                             "together": together[c][:100]})
    # undrafted requests in a batch of 8 equal their alone replies too (the overlap path)
    plain = {}
    threads = [threading.Thread(target=lambda c=c: plain.__setitem__(c, send(body(*c, 0)))) for c in cases]
    [t.start() for t in threads]; [t.join() for t in threads]
    summary = {"alone_equal": sum(r["alone_equal"] for r in rows), "together_equal": sum(r["together_equal"] for r in rows),
               "of": len(rows), "plain_together_equal": sum(plain[c] == ref[c] for c in cases), "plain_of": len(cases),
               "metrics": counts}
    print(json.dumps(summary, indent=1), flush=True)
    (out / "exact.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
finally:
    for p in procs:
        stop_server(p)

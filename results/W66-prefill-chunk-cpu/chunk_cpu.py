"""0890 on this CPU: synthetic:trained, the local set, a 1,024-token step budget; a ~17K-token prompt
streamed while four streams decode (started before it, 160-token replies); PB_PREFILL_CHUNK off,
256, 64 (a server each, in turn). Writes chunk.json: the long prompt's first token, each stream's
token times."""
import json, statistics, sys, threading, time
from pathlib import Path

import httpx

sys.path.insert(0, ".")
from tests.conftest import ALL_ON, LOCAL, Server  # noqa: E402
from tests.test_prefill_turns import ENGINE_ARGS, LONG  # noqa: E402
from patchbay.series import build, series  # noqa: E402
from patchbay.runtime import trained  # noqa: E402
from patchbay.runtime.models import trained_path  # noqa: E402

out = Path(sys.argv[1]).resolve(); out.mkdir(parents=True, exist_ok=True)
loaded, problems = series.load()
engine = build.build(loaded)
model = str(trained.write_trained(trained_path(0, LOCAL.synth_context), seed=0, context=LOCAL.synth_context))
STREAMS, REPLY = 4, 160


def stream(url, content, max_tokens, rec):
    rec["start"] = time.monotonic(); rec["times"] = []
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=900) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage"):
                    rec["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
                if any(c["delta"].get("content") for c in chunk.get("choices", [])):
                    rec["times"].append(time.monotonic())


results = {}
for chunk in ("0", "256", "64"):
    knobs = {**ALL_ON, "PB_PREFILL_CHUNK": chunk}
    server = Server(engine, model, knobs, out / f"run-{chunk}", engine_args=ENGINE_ARGS)
    try:
        stream(server.url, "Warm up.", 2, {})
        recs = [{} for _ in range(STREAMS)]
        threads = [threading.Thread(target=stream, args=(server.url, f"Stream {i}: count to one hundred.", REPLY,
                                                         recs[i])) for i in range(STREAMS)]
        for t in threads:
            t.start()
        while not all(r.get("times") for r in recs):
            time.sleep(0.01)
        long = {}
        stream(server.url, f"Chunk {chunk}. " + LONG, 8, long)
        for t in threads:
            t.join()
        sent, first = long["start"], long["times"][0]
        during = [[t for t in r["times"] if sent < t < first] for r in recs]
        gaps = [b - a for d in during for a, b in zip(d, d[1:])]
        results[chunk] = {
            "long_prompt_tokens": long["prompt_tokens"], "long_ttft_s": round(first - sent, 2),
            "stream_tokens_during_prefill": [len(d) for d in during],
            "stream_gap_during_prefill_s": {"mean": round(statistics.mean(gaps), 3) if gaps else None,
                                            "max": round(max(gaps), 3) if gaps else None},
            "stream_reply_s": [round(r["times"][-1] - r["start"], 2) for r in recs],
        }
        print(chunk, json.dumps(results[chunk]), flush=True)
    finally:
        server.stop()
(out / "chunk.json").write_text(json.dumps(results, indent=1))

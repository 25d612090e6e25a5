"""0880 on this CPU: synthetic:trained, the local set, a 256-token step budget; a ~17K-token prompt
streamed while one client sends short requests one after another; knob off then on (two servers in
turn). Writes turns.json: the long prompt's first token, every short request's first token and end."""
import json, sys, threading, time
from pathlib import Path

import httpx

sys.path.insert(0, ".")
from tests.conftest import ALL_ON, LOCAL, Server, metric  # noqa: E402
from tests.test_prefill_turns import ENGINE_ARGS, LONG  # noqa: E402
from patchbay.series import build, series  # noqa: E402
from patchbay.runtime import trained  # noqa: E402
from patchbay.runtime.models import trained_path  # noqa: E402

out = Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True)
loaded, problems = series.load()
engine = build.build(loaded)
model = str(trained.write_trained(trained_path(0, LOCAL.synth_context), seed=0, context=LOCAL.synth_context))


def stream(url, content, max_tokens):
    t0 = time.monotonic(); first = None; usage = None
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                if first is None and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                    first = time.monotonic()
    return {"start": t0, "first": first, "end": time.monotonic(), "prompt_tokens": usage and usage["prompt_tokens"]}


results = {}
for knob in ("off", "on"):
    knobs = {**ALL_ON, **({"PB_PREFILL_TURNS": "1"} if knob == "on" else {})}
    server = Server(engine, model, knobs, out / f"run-{knob}", engine_args=ENGINE_ARGS)
    try:
        stream(server.url, "Warm up.", 2)
        long = {}
        t = threading.Thread(target=lambda: long.update(stream(server.url, LONG, 8)))
        t.start()
        while metric(server, "pb_requests_running") < 1:
            time.sleep(0.02)
        shorts = []
        while t.is_alive():
            shorts.append(stream(server.url, f"Short question {len(shorts)}: name three prime numbers.", 8))
        t.join()
        t0 = long["start"]
        results[knob] = {"long": {k: (v - t0 if k in ("first", "end") else v) for k, v in long.items() if k != "start"},
                         "shorts": [{"sent": s["start"] - t0, "ttft": s["first"] - s["start"], "end": s["end"] - t0}
                                    for s in shorts]}
        r = results[knob]
        print(knob, "long ttft %.2f" % r["long"]["first"], "shorts", len(r["shorts"]),
              "ttft max %.2f" % max(s["ttft"] for s in r["shorts"]), flush=True)
    finally:
        server.stop()
(out / "turns.json").write_text(json.dumps(results, indent=1))

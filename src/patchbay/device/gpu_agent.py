"""The agent API on a GPU: the checks of tests/test_agent_api.py that depend on the device
(the sampler's per-row hook, the xgrammar bitmask on CUDA, CUDA graphs), run against a live
server of synthetic:air12, written as a JSON report for a results window.

    python -m patchbay.device agent --out DIR     (on the GPU machine, through scripts/gpu-run.sh)
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx

# The reply-path knobs are per-request, so one server serves both arms of the cost A/B:
# all off (upstream's path) against all on (patchbay's path with its sampler hook).
PATH_KNOBS = ("PB_GLM_MESSAGES", "PB_GLM_PARSER", "PB_REQUEST_SAMPLING", "PB_STRUCTURED_OUTPUT", "PB_TOOL_CHOICE")
KNOBS = {**{k: "1" for k in PATH_KNOBS}, "PB_FINGERPRINT": "1", "PB_SSE_DONE": "1"}
CITY = {"type": "object", "additionalProperties": False, "required": ["city", "pop"],
        "properties": {"city": {"type": "string", "maxLength": 12}, "pop": {"type": "integer", "minimum": 0,
                                                                           "maximum": 99}}}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1,
                                                                        "maximum": 7}}}}}
ASK = [{"role": "user", "content": "Give me a city."}]


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)


def checks(url: str, model: str, cuda_graphs: bool, graph_sampling: bool = False) -> list[dict]:
    """Each check: name, ok, detail. Under CUDA graphs without PB_GRAPH_SAMPLING (0210) the
    requests that need the sampler's hook are expected to be refused."""
    out = []

    def record(name, ok, detail):
        out.append({"name": name, "ok": bool(ok), "detail": detail})

    base = {"model": model, "max_tokens": 48}
    greedy = _post(url, {**base, "messages": ASK})
    record("plain greedy request", greedy.status_code == 200, greedy.status_code)
    schema = {**base, "messages": ASK,
              "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": CITY}}}
    if cuda_graphs and not graph_sampling:
        refused = _post(url, schema)
        record("grammar refused under CUDA graphs", refused.status_code == 400
               and "CUDA graphs" in refused.json()["error"]["message"], refused.text[:200])
        return out
    r = _post(url, schema)
    try:
        value = json.loads(r.json()["choices"][0]["message"]["content"])
        ok = set(value) == {"city", "pop"} and len(value["city"]) <= 12 and 0 <= value["pop"] <= 99
    except (KeyError, ValueError, TypeError):
        ok, value = False, r.text[:200]
    record("json_schema reply follows the schema", ok, value)
    with ThreadPoolExecutor(4) as pool:
        mine = pool.submit(_post, url, schema)
        others = [pool.submit(_post, url, {**base, "messages": ASK, "temperature": 1.0}) for _ in range(3)]
        batched = mine.result().json()["choices"][0]["message"]["content"]
        [o.result() for o in others]
    record("constrained reply alone == beside 3 others", batched == r.json()["choices"][0]["message"]["content"],
           batched)
    seeded = {**base, "messages": ASK, "temperature": 0.8, "seed": 3}
    a, b = (_post(url, seeded).json().get("pb_fingerprint") for _ in range(2))
    record("seeded sampling reproducible", a == b and a is not None, [a, b])
    tools = {**base, "messages": [{"role": "user", "content": "Weather?"}], "tools": [WEATHER],
             "reasoning_effort": "none", "max_tokens": 200,
             "tool_choice": {"type": "function", "function": {"name": "weather"}}}
    r = _post(url, tools)
    calls = r.json()["choices"][0]["message"].get("tool_calls") or []
    args = json.loads(calls[0]["function"]["arguments"]) if calls else {}
    choice = r.json()["choices"][0]
    record("named tool_choice gives one typed call", len(calls) == 1 and 1 <= args.get("days", 0) <= 7
           and isinstance(args.get("city"), str), {"calls": calls, "finish_reason": choice["finish_reason"],
                                                   "content": choice["message"].get("content")})
    return out


def write_report(out_dir, results: dict) -> bool:
    ok = all(c["ok"] for part in results.values() for c in part)
    (out_dir / "agent.json").write_text(json.dumps({"ok": ok, "parts": results}, indent=1) + "\n")
    for name, part in results.items():
        for c in part:
            print(f"[{name}] {'PASS' if c['ok'] else 'FAIL'} {c['name']}: {str(c['detail'])[:160]}", flush=True)
    return ok


def assemble(results_dir, cost_window, reports: dict, builds: dict, title: str):
    """One window from a device run: the reply path's cost (an `ab` window, kept whole under
    `path-cost/`) and the checks of each server setting (`agent.json`)."""
    import shutil
    from pathlib import Path

    from ..measure import windows

    window = windows.create(Path(results_dir), "agent-api-h200")
    shutil.copytree(cost_window, window / "path-cost")
    shutil.copy(Path(cost_window) / "command.txt", window / "command.txt")
    parts = {name: json.loads(Path(path).read_text())[name] for name, path in reports.items()}
    (window / "agent.json").write_text(json.dumps({"builds": builds, "parts": parts}, indent=1) + "\n")
    cost = json.loads((Path(cost_window) / "summary.json").read_text())
    lines = [f"# W{window.name[1:3]}: {title}", "",
             "## Device checks (`python -m patchbay.device agent`, synthetic:air12, bf16)", "",
             "| server setting | build | check | result |", "|---|---|---|---|"]
    for name, checks in parts.items():
        for check in checks:
            lines.append(f"| {name} | `{builds[name]}` | {check['name']} | {'pass' if check['ok'] else 'FAIL'} |")
    lines += ["", "## Cost of patchbay's reply path (`path-cost/`)", "",
              "Per-request arms on one server without CUDA graphs: A sends every reply-path knob off "
              "(upstream's path), B every one on (parser, message fixes, the sampler's per-row hook with a "
              f"plain greedy Spec per request). Build `{builds['path-cost']}`.", ""]
    for level, data in cost["levels"].items():
        agg = data["aggregate"]
        lines.append(f"- C{level}: aggregate A {agg['A_tps']:.1f} / B {agg['B_tps']:.1f} tok/s, "
                     f"B/A {agg['ratio']:.3f} [{agg['ci95'][0]:.3f}, {agg['ci95'][1]:.3f}]")
    (window / "SUMMARY.md").write_text("\n".join(lines) + "\n")
    (window / "summary.json").write_text(json.dumps({"checks_ok": all(c["ok"] for p in parts.values() for c in p),
                                                      "builds": builds, "cost": cost["levels"]}, indent=2) + "\n")
    return window

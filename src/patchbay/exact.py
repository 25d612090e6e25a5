"""Exactness checks between two engines (e.g. every knob unset vs pristine upstream).

Two views, both compared byte for byte:
- `probe`: run inside one engine (`python -m patchbay.exact probe MODEL`, the engine's
  build first on PYTHONPATH): greedy token ids and a sha256 of the logits for each of the
  exactness prompts, through `generate` and through continuous batching.
- `http_transcript`: the same fixed requests sent to a live server; responses are kept
  whole, with only the per-request id and timestamps blanked.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import httpx

# Eight prompts of different shapes: code, prose, JSON, a long-ish instruction, tool use.
EXACTNESS_PROMPTS = [
    [{"role": "user", "content": "Write a Python function that reverses a string."}],
    [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}],
    [{"role": "user", "content": 'Return {"name": "Ada", "born": 1815} as YAML.'}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count from 1 to 10."}],
    [{"role": "user", "content": "SELECT name FROM users WHERE id = 42; explain this query."}],
    [{"role": "user", "content": "Fix the bug: def add(a, b): return a - b"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"},
     {"role": "user", "content": "What did I just say?"}],
    [{"role": "user", "content": " ".join(f"item{i}" for i in range(60)) + " — summarize the list."}],
]
NEW_TOKENS = 16


def probe(model_dir: str) -> dict:
    """Greedy ids and logits hashes for every exactness prompt, from the engine on sys.path."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    greedy = GenerationConfig(max_new_tokens=NEW_TOKENS, do_sample=False,
                              eos_token_id=model.generation_config.eos_token_id)
    prompts = [tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
               for m in EXACTNESS_PROMPTS]
    out = {"engine": transformers.__file__, "generate": [], "batch": []}
    with torch.inference_mode():
        for ids in prompts:
            result = model.generate(torch.tensor([ids]), generation_config=greedy, output_logits=True,
                                    return_dict_in_generate=True)
            logits = torch.stack(result.logits).to(torch.float32).contiguous()
            out["generate"].append({"ids": result.sequences[0, len(ids):].tolist(),
                                    "logits_sha256": hashlib.sha256(logits.numpy().tobytes()).hexdigest()})
    # Continuous batching manages its own inference mode; it refuses to run inside one.
    batch = model.generate_batch(inputs=prompts, generation_config=greedy, progress_bar=False)
    for key in sorted(batch, key=lambda k: int(str(k).rsplit("_", 1)[-1])):
        out["batch"].append({"ids": list(batch[key].generated_tokens)})
    return out


def probe_engine(engine_env: dict[str, str], model_dir: str) -> dict:
    """Run `probe` in a fresh interpreter whose transformers is the given engine."""
    proc = subprocess.run([sys.executable, "-m", "patchbay.exact", "probe", model_dir], env=engine_env,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"probe failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _blank(value):
    """Drop what differs between any two runs: ids and timestamps."""
    if isinstance(value, dict):
        return {k: ("*" if k in ("id", "created") else _blank(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank(v) for v in value]
    return value


def _body(r: httpx.Response):
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        events = []
        for line in r.text.splitlines():
            if line.startswith("data: "):
                data = line[6:]
                try:
                    events.append(_blank(json.loads(data)))
                except json.JSONDecodeError:
                    events.append(data)
        return {"sse": events}
    try:
        return _blank(r.json())
    except ValueError:
        return r.text


def transcript_requests(model: str) -> list[tuple[str, str, dict | None]]:
    """The fixed requests of an HTTP transcript: normal use first, client mistakes last."""
    reqs: list[tuple[str, str, dict | None]] = [("GET", "/health", None)]
    for messages in EXACTNESS_PROMPTS:
        reqs.append(("POST", "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 12}))
    for messages in EXACTNESS_PROMPTS[:3]:
        reqs.append(("POST", "/v1/chat/completions",
                     {"model": model, "messages": messages, "max_tokens": 8, "stream": True}))
    reqs += [
        ("POST", "/v1/completions", {"model": model, "prompt": "def fibonacci(n):", "max_tokens": 10}),
        ("POST", "/v1/completions", {"model": model, "prompt": "import os\n", "max_tokens": 6, "stream": True}),
        ("POST", "/v1/completions", {"model": model, "prompt": [1, 2, 3], "max_tokens": 4}),
        ("POST", "/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "x"}],
                                          "max_tokens": 4, "not_a_field": 1}),
        ("POST", "/v1/chat/completions", {"model": "some/other-model", "messages": [], "max_tokens": 4}),
        ("POST", "/tokenize", {"prompt": "hello"}),
        ("GET", "/v1/models", None),
    ]
    return reqs


def http_transcript(url: str, model: str, timeout: float = 300.0) -> list[dict]:
    out = []
    with httpx.Client(base_url=url, timeout=timeout) as client:
        for method, path, body in transcript_requests(model):
            r = client.request(method, path, json=body)
            out.append({"request": f"{method} {path} {json.dumps(body)[:80] if body else ''}".strip(),
                        "status": r.status_code, "body": _body(r)})
    return out


def first_difference(a, b, path: str = "") -> str | None:
    """Where two JSON-like values first differ, as `path: a != b` (None when equal)."""
    if type(a) is type(b) and isinstance(a, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key}: {'missing' if key not in a else 'present'} != " \
                       f"{'missing' if key not in b else 'present'}"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if type(a) is type(b) and isinstance(a, list):
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            extra = a[len(b)] if len(a) > len(b) else b[len(a)]
            return f"{path}: length {len(a)} != {len(b)} (first extra item: {json.dumps(extra)[:80]})"
        return None
    if a != b:
        return f"{path or '.'}: {json.dumps(a)[:80]} != {json.dumps(b)[:80]}"
    return None


def differences(a: list[dict], b: list[dict]) -> list[str]:
    """One line per request whose status or body differs, naming where it first differs."""
    diffs = []
    for x, y in zip(a, b, strict=True):
        found = first_difference({"status": x["status"], "body": x["body"]},
                                 {"status": y["status"], "body": y["body"]})
        if found:
            diffs.append(f"{x['request']}: {found}")
    return diffs


# ---- the runnable suite (`patchbay exact`) -------------------------------------------------------


def first_token_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two sequences differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _row(check: str, prompt: int, a_ids, b_ids, note: str = "") -> dict:
    at = first_token_difference(a_ids, b_ids)
    detail = note
    if at is not None:
        got = lambda ids: ids[at] if at < len(ids) else "end"  # noqa: E731
        detail = f"token {at}: {got(a_ids)} != {got(b_ids)}"
    return {"check": check, "prompt": prompt, "equal": at is None, "detail": detail or f"{len(a_ids)} reply tokens"}


def check_probes(a: dict, b: dict, check: str) -> list[dict]:
    """Rows comparing two probes (greedy ids through generate and batching, and logits hashes)."""
    rows = []
    for i, (x, y) in enumerate(zip(a["generate"], b["generate"], strict=True)):
        row = _row(f"{check} (generate)", i, x["ids"], y["ids"])
        if row["equal"] and x["logits_sha256"] != y["logits_sha256"]:
            row.update(equal=False, detail="same ids, different logits")
        rows.append(row)
    for i, (x, y) in enumerate(zip(a["batch"], b["batch"], strict=True)):
        rows.append(_row(f"{check} (batching)", i, x["ids"], y["ids"]))
    return rows


def chat_ids(client: httpx.Client, model: str, messages: list[dict], knobs: dict | None = None,
             max_tokens: int = NEW_TOKENS) -> list[int]:
    """One greedy reply as token ids: the reply text tokenized by the server's /tokenize
    (PB_TOKENIZE), so a difference can be named by token."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if knobs:
        body["pb_knobs"] = knobs
    r = client.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        raise RuntimeError(f"the server answered HTTP {r.status_code}: {r.text[:200]}")
    text = r.json()["choices"][0]["message"]["content"] or ""
    t = client.post("/tokenize", json={"model": model, "prompt": text, "add_special_tokens": False})
    if t.status_code != 200:
        raise RuntimeError("naming tokens needs the server's /tokenize (start it with PB_TOKENIZE=1)")
    return t.json()["tokens"]


def check_same_bits(url: str, model: str, knob: str, off, on, timeout: float = 300.0) -> list[dict]:
    """A same-bits knob, per request: every exactness prompt with the knob off and on."""
    with httpx.Client(base_url=url, timeout=timeout) as client:
        return [_row(f"{knob}={on} == {knob}={off}", i, chat_ids(client, model, m, {knob: off}),
                     chat_ids(client, model, m, {knob: on})) for i, m in enumerate(EXACTNESS_PROMPTS)]


def check_batched(url: str, model: str, others: int, timeout: float = 300.0) -> list[dict]:
    """Each exactness prompt alone, then again while `others` other prompts run next to it."""
    from concurrent.futures import ThreadPoolExecutor

    rows = []
    with httpx.Client(base_url=url, timeout=timeout) as client:
        alone = [chat_ids(client, model, m) for m in EXACTNESS_PROMPTS]
        with ThreadPoolExecutor(max_workers=others + 1) as pool:
            for i, messages in enumerate(EXACTNESS_PROMPTS):
                neighbours = [EXACTNESS_PROMPTS[(i + k) % len(EXACTNESS_PROMPTS)] for k in range(1, others + 1)]
                futures = [pool.submit(chat_ids, client, model, m, None, 2 * NEW_TOKENS) for m in neighbours]
                mine = chat_ids(client, model, messages)
                for f in futures:
                    f.result()
                rows.append(_row(f"next to {others} others == alone", i, mine, alone[i]))
    return rows


def render(rows: list[dict]) -> str:
    width = max(len(r["check"]) for r in rows)
    lines = [f"{'check':<{width}}  prompt  result  detail"]
    for r in rows:
        lines.append(f"{r['check']:<{width}}  {r['prompt']:>6}  {'same' if r['equal'] else 'DIFF':<6}  {r['detail']}")
    bad = sum(not r["equal"] for r in rows)
    lines.append(f"{len(rows) - bad} same, {bad} different")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "probe":
        print(json.dumps(probe(argv[1])))
        return 0
    print("usage: python -m patchbay.exact probe MODEL_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

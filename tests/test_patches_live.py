"""Each patch's behaviour, knob on and knob off, through real clients against live servers.

`server_on` runs the embedded default's knob set; `server_off` the same build with every
knob unset (upstream behaviour). Per-request overrides go through `pb_knobs`.
"""

import json
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

pytestmark = pytest.mark.engine

CHAT = [{"role": "user", "content": "Write a haiku about patches."}]


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def sse_data(server, path: str, body: dict) -> list[str]:
    with httpx.stream("POST", f"{server.url}{path}", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


# ---- 0020 PB_SSE_DONE ---------------------------------------------------------------------


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": CHAT}),
    ("/v1/completions", {"prompt": "def main():"}),
])
def test_streams_end_with_done_when_on(server_on, server_off, path, body):
    body = {**body, "model": server_on.model, "max_tokens": 6, "stream": True}
    on = sse_data(server_on, path, body)
    off = sse_data(server_off, path, body)
    assert on[-1] == "[DONE]" and on.count("[DONE]") == 1
    assert "[DONE]" not in off  # upstream's stream just ends
    assert on[:-1] != [] and len(on) - 1 == len(off)  # nothing else added or lost


def test_sse_done_per_request_both_ways(server_on, server_off):
    body = {"model": server_on.model, "messages": CHAT, "max_tokens": 4, "stream": True}
    assert "[DONE]" not in sse_data(server_on, "/v1/chat/completions", {**body, "pb_knobs": {"PB_SSE_DONE": 0}})
    assert sse_data(server_off, "/v1/chat/completions", {**body, "pb_knobs": {"PB_SSE_DONE": "1"}})[-1] == "[DONE]"


def test_openai_client_streams_and_completes(server_on):
    c = client(server_on)
    stream = c.chat.completions.create(model=server_on.model, messages=CHAT, max_tokens=8, stream=True)
    streamed = "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices)
    whole = c.chat.completions.create(model=server_on.model, messages=CHAT, max_tokens=8)
    assert streamed and streamed == whole.choices[0].message.content  # greedy: same text both ways


# ---- 0030 PB_CONTEXT_LIMIT ----------------------------------------------------------------


def long_messages(words: int) -> list[dict]:
    return [{"role": "user", "content": " ".join(f"w{i}" for i in range(words))}]


def test_prompt_over_context_is_a_400_in_openai_shape(server_on):
    with pytest.raises(openai.BadRequestError) as err:
        client(server_on).chat.completions.create(model=server_on.model, messages=long_messages(900), max_tokens=4)
    assert err.value.status_code == 400
    assert err.value.code == "context_length_exceeded"
    assert "maximum context length is 512 tokens" in err.value.message
    body = err.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == "messages"


def test_completion_prompt_over_context_names_the_prompt(server_on):
    r = httpx.post(f"{server_on.url}/v1/completions", timeout=60,
                   json={"model": server_on.model, "prompt": "x " * 900, "max_tokens": 4})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "prompt"


def test_max_tokens_over_the_room_left_is_clamped(server_on):
    c = client(server_on)
    messages = long_messages(150)
    n = c.chat.completions.create(model=server_on.model, messages=messages, max_tokens=1).usage.prompt_tokens
    assert 300 < n < 500, n  # the prompt leaves some room, less than max_tokens
    # 0610 answers this max_tokens with a 400 (tests/test_openai_surface.py); without it 0030 clamps
    reply = c.chat.completions.create(model=server_on.model, messages=messages, max_tokens=400,
                                      extra_body={"pb_knobs": {"PB_OPENAI_SHAPES": 0}})
    assert reply.usage.completion_tokens <= 512 - n
    if reply.usage.completion_tokens == 512 - n:
        assert reply.choices[0].finish_reason == "length"


def test_context_limit_off_per_request_lets_upstream_decide(server_on):
    # With the knob off for this request, the 400 does not come from the patch.
    r = httpx.post(f"{server_on.url}/v1/chat/completions", timeout=120,
                   json={"model": server_on.model, "messages": long_messages(900), "max_tokens": 1,
                         "pb_knobs": {"PB_CONTEXT_LIMIT": 0}})
    assert "context_length_exceeded" not in r.text


# ---- 0040 PB_MODELS_INFO ------------------------------------------------------------------


def test_models_lists_the_served_model_with_its_context(server_on):
    models = client(server_on).models.list().data
    assert models[0].id == Path(server_on.model).name  # 0590's served name
    assert models[0].model_extra["max_model_len"] == 512
    assert models[0].model_extra["context_length"] == 512


def test_models_without_the_knob_is_upstreams_500(server_off):
    # Upstream scans the (here empty) Hugging Face cache and fails; the knob is what fixes it.
    assert httpx.get(f"{server_off.url}/v1/models", timeout=30).status_code == 500


# ---- 0050 PB_TOKENIZE ---------------------------------------------------------------------


def test_tokenize_prompt_matches_the_tokenizer(server_on):
    text = "def add(a, b):\n    return a + b\n"
    r = httpx.post(f"{server_on.url}/tokenize", json={"prompt": text}, timeout=30)
    assert r.status_code == 200
    expected = AutoTokenizer.from_pretrained(server_on.model)(text)["input_ids"]
    assert r.json()["tokens"] == expected and r.json()["count"] == len(expected)
    assert r.json()["max_model_len"] == 512


def test_tokenize_messages_counts_what_chat_feeds_the_model(server_on):
    r = httpx.post(f"{server_on.url}/tokenize", json={"messages": CHAT}, timeout=30)
    usage = client(server_on).chat.completions.create(model=server_on.model, messages=CHAT, max_tokens=1).usage
    assert r.json()["count"] == usage.prompt_tokens


def test_token_id_prompt_equals_the_text_prompt(server_on):
    text = "import json\n"
    ids = httpx.post(f"{server_on.url}/tokenize", json={"prompt": text}, timeout=30).json()["tokens"]
    c = client(server_on)
    by_text = c.completions.create(model=server_on.model, prompt=text, max_tokens=8)
    by_ids = c.completions.create(model=server_on.model, prompt=ids, max_tokens=8)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("prompt", [[], [1, "two"], [-1], [10**9]])
def test_bad_token_id_prompts_are_400s(server_on, prompt):
    r = httpx.post(f"{server_on.url}/v1/completions", timeout=30,
                   json={"model": server_on.model, "prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "prompt"


def test_tokenize_needs_exactly_one_input(server_on):
    r = httpx.post(f"{server_on.url}/tokenize", json={"prompt": "a", "messages": CHAT}, timeout=30)
    assert r.status_code == 400 and "exactly one" in r.json()["error"]["message"]


def test_without_the_knob_there_is_no_tokenize_and_no_id_prompts(server_off):
    assert httpx.post(f"{server_off.url}/tokenize", json={"prompt": "a"}, timeout=30).status_code == 404
    r = httpx.post(f"{server_off.url}/v1/completions", timeout=30,
                   json={"model": server_off.model, "prompt": [1, 2, 3], "max_tokens": 2})
    assert r.status_code == 400 and "prompt must be a string" in r.text


# ---- 0010 knob runtime: per-request overrides ---------------------------------------------


@pytest.mark.parametrize("knobs,code,words", [
    ({"PB_TOKENIZE": 1}, "knob_not_per_request", "read once at start"),
    ({"PB_NO_SUCH_KNOB": 1}, "invalid_knob", "not a knob of this build"),
    ({"PB_SSE_DONE": "yes"}, "invalid_knob", "allowed: 0, 1"),
])
def test_bad_pb_knobs_are_400s_naming_the_knob(server_on, knobs, code, words):
    r = httpx.post(f"{server_on.url}/v1/chat/completions", timeout=30,
                   json={"model": server_on.model, "messages": CHAT, "max_tokens": 2, "pb_knobs": knobs})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == code and words in error["message"] and next(iter(knobs)) in error["message"]


# ---- 0060 PB_FINGERPRINT ------------------------------------------------------------------


def test_fingerprints_identify_build_knobs_and_tokens(server_on, patched_engine):
    body = {"model": server_on.model, "messages": CHAT, "max_tokens": 6}
    whole = httpx.post(f"{server_on.url}/v1/chat/completions", json=body, timeout=60)
    assert whole.headers["x-pb-build"] == patched_engine.build_id
    fp = whole.json()["pb_fingerprint"]
    assert len(fp) == 16
    assert f"request={whole.headers['x-request-id']} tokens=" in server_on.files.log.read_text()
    assert f"fp={fp}" in server_on.files.log.read_text()  # the log records it with the request id
    streamed = sse_data(server_on, "/v1/chat/completions", {**body, "stream": True})
    final = json.loads(streamed[-2])  # the last chunk before [DONE]
    assert final["choices"][0]["finish_reason"] and final["pb_fingerprint"] == fp  # same tokens, same hash
    other = httpx.post(f"{server_on.url}/v1/chat/completions", timeout=60,
                       json={**body, "messages": [{"role": "user", "content": "Something else entirely"}]})
    assert other.json()["pb_fingerprint"] != fp
    # The knob hash follows per-request overrides.
    overridden = httpx.post(f"{server_on.url}/v1/chat/completions", timeout=60,
                            json={**body, "pb_knobs": {"PB_CONTEXT_LIMIT": 0}})
    assert overridden.headers["x-pb-knobs"] != whole.headers["x-pb-knobs"]
    assert overridden.json()["pb_fingerprint"] == fp  # a same-bits knob: the same tokens


def test_fingerprint_matches_the_token_ids(server_on):
    """The hash is of the generated ids: recompute it from a token-id prompt's reply."""
    import hashlib

    tokenizer = AutoTokenizer.from_pretrained(server_on.model)
    r = httpx.post(f"{server_on.url}/v1/completions", timeout=60,
                   json={"model": server_on.model, "prompt": "def ", "max_tokens": 5}).json()
    ids = tokenizer(r["choices"][0]["text"], add_special_tokens=False)["input_ids"]
    expected = hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]
    if len(ids) == r["usage"]["completion_tokens"]:  # the text re-tokenizes to the same ids
        assert r["pb_fingerprint"] == expected


def test_no_fingerprint_without_the_knob(server_off):
    r = httpx.post(f"{server_off.url}/v1/chat/completions", timeout=60,
                   json={"model": server_off.model, "messages": CHAT, "max_tokens": 3})
    assert "pb_fingerprint" not in r.json() and "x-pb-build" not in r.headers
    on = httpx.post(f"{server_off.url}/v1/chat/completions", timeout=60,
                    json={"model": server_off.model, "messages": CHAT, "max_tokens": 3,
                          "pb_knobs": {"PB_FINGERPRINT": 1}})
    assert "pb_fingerprint" in on.json() and "x-pb-knobs" in on.headers


# ---- 0580 PB_METRICS ----------------------------------------------------------------------


def test_metrics_and_health_both_ways(server_on, server_off):
    on = httpx.get(f"{server_on.url}/metrics", timeout=30)
    assert on.status_code == 200 and "pb_requests_total" in on.text
    health = httpx.get(f"{server_on.url}/health", timeout=30).json()
    assert health["status"] == "ok" and {"uptime_s", "requests", "tokens", "ranks"} <= set(health)
    # Without the knob: no /metrics, and upstream's /health to the byte.
    assert httpx.get(f"{server_off.url}/metrics", timeout=30).status_code == 404
    off = httpx.get(f"{server_off.url}/health", timeout=30)
    assert off.status_code == 200 and off.content == b'{"status":"ok"}'


# ---- 0690 PB_STREAM_INTERVAL --------------------------------------------------------------


def test_stream_interval_writes_the_same_events_in_fewer_writes(server_on):
    """With the knob at 10 s a 24-token reply goes out in at most four writes (the role event, the
    first token's, the rest with the end, then [DONE]), so the client reads at most four body
    pieces; the events are those of the same greedy reply streamed a write each (the per-request
    id and time aside)."""
    body = {"model": server_on.model, "messages": CHAT, "max_tokens": 24, "temperature": 0, "stream": True,
            "logprobs": True, "top_logprobs": 2, "ignore_eos": True}

    def streamed(knob: int) -> tuple[list[dict], int]:
        with httpx.stream("POST", f"{server_on.url}/v1/chat/completions", timeout=120,
                          json={**body, "pb_knobs": {"PB_STREAM_INTERVAL": knob}}) as r:
            assert r.status_code == 200, r.read()
            pieces = list(r.iter_raw())
        text = b"".join(pieces).decode()
        events = [json.loads(line[6:]) for line in text.split("\n") if line.startswith("data: {")]
        for event in events:
            event.pop("id"), event.pop("created"), event.pop("pb_fingerprint", None)
        assert text.endswith("data: [DONE]\n\n")
        return events, len(pieces)

    (plain, _), (kept, reads) = streamed(0), streamed(10_000)
    assert kept == plain and len(plain) >= 26  # the role event, 24 tokens, the end (and usage)
    assert reads <= 4, reads

"""How a long prompt's prefill shares steps, knobs off (upstream) and on.

0880 PB_PREFILL_TURNS: a short request sent while a long prompt prefills a chunk a step starts
within two steps with the knob on, and waits for the whole prompt without it (upstream's FIFO
order). 0890 PB_PREFILL_CHUNK: a stream decoding beside the long prompt gets a token from each of
the prompt's chunks; with the knob the chunks beside it are short and the stream finishes before
the prompt's first token, without it the prompt's few large chunks come first. Replies are the
same either way. One pair of servers serves both (each knob's effect needs the other's
situation: turns order prompts only, the chunk cap acts only beside decoding rows)."""

import threading
import time

import httpx
import pytest

from .conftest import ALL_ON, Server, metric

# A step's token budget small against the long prompt (about 17K tokens): it prefills in 17 steps, or
# beside a decoding stream with 0890 in chunks of CHUNK tokens (about 130 steps).
ENGINE_ARGS = "--cb-max-batch-tokens 1024 --cb-num-blocks 160"
CHUNK = 128
STREAM_TOKENS = 40  # more than the 17 steps of the prompt's prefill, fewer than its 130 chunks
LONG = "Read these notes and say which one repeats. " + " ".join(f"note {i} says item {i * 7 % 1009}."
                                                                   for i in range(1500))


@pytest.fixture(scope="module", params=["off", "on"])
def turns_server(request, patched_engine, trained_model, tmp_path_factory):
    on = {"PB_PREFILL_TURNS": "1", "PB_PREFILL_CHUNK": str(CHUNK)}  # the local set has both (a 2,048 chunk)
    knobs = {**ALL_ON, **(on if request.param == "on" else {"PB_PREFILL_TURNS": "0", "PB_PREFILL_CHUNK": "0"})}
    server = Server(patched_engine, trained_model, knobs, tmp_path_factory.mktemp(f"run-turns-{request.param}"),
                    engine_args=ENGINE_ARGS)
    yield request.param, server
    server.stop()


def _stream(url: str, body: dict, out: dict) -> None:
    """A streamed request: each content piece's arrival time (`times`, the first also as `first`),
    the reply and its prompt tokens into `out`."""
    out["times"], text = [], []
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = httpx.Response(200, content=line[6:]).json()
            if chunk.get("usage"):
                out["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    out["times"].append(time.monotonic())
                    out.setdefault("first", out["times"][0])
                    text.append(choice["delta"]["content"])
    out["text"] = "".join(text)


def _long_request(url: str, out: dict, content: str = LONG) -> None:
    """A long prompt, streamed, a 4-token reply: see _stream."""
    _stream(url, {"messages": [{"role": "user", "content": content}], "max_tokens": 4, "ignore_eos": True}, out)


def _short_request(url: str) -> str:
    body = {"messages": [{"role": "user", "content": "Name three prime numbers."}], "max_tokens": 4,
            "ignore_eos": True}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_a_short_request_does_not_wait_for_a_long_prompt(turns_server):
    knob, server = turns_server
    alone = _short_request(server.url)  # the short reply with nothing beside it
    long: dict = {}
    thread = threading.Thread(target=_long_request, args=(server.url, long))
    thread.start()
    deadline = time.monotonic() + 120
    while metric(server, "pb_requests_running") < 1:  # the long prompt is in the engine, prefilling
        assert time.monotonic() < deadline and thread.is_alive(), "the long request never reached the engine"
        time.sleep(0.02)
    sent = time.monotonic()
    short = _short_request(server.url)
    done = time.monotonic()
    thread.join(600)
    assert long["prompt_tokens"] > 12_000, long  # more than 11 steps of 1,024 tokens
    assert "first" in long and long["first"] > sent, "the long prompt was done before the short request came"
    assert short == alone  # which requests shared a step changes nothing a row computes
    if knob == "on":
        assert done < long["first"], "with the knob the short request finished before the long prompt's first token"
    else:
        assert done > long["first"], "upstream's order: the short request waited for the long prompt's prefill"


def test_a_decoding_stream_keeps_pace_beside_a_long_prompt(turns_server):
    knob, server = turns_server
    body = {"messages": [{"role": "user", "content": "Count from one to fifty in words."}],
            "max_tokens": STREAM_TOKENS, "ignore_eos": True}
    alone = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=600)
    assert alone.status_code == 200, alone.text
    stream: dict = {}
    streamer = threading.Thread(target=_stream, args=(server.url, body, stream))
    streamer.start()
    deadline = time.monotonic() + 120
    while not stream.get("times"):  # the stream decodes
        assert time.monotonic() < deadline and streamer.is_alive(), "the stream never produced a token"
        time.sleep(0.01)
    long: dict = {}
    sent = time.monotonic()
    _long_request(server.url, long, "Other notes. " + LONG)  # not LONG: its prefix is cached by the test above
    streamer.join(600)
    assert long["prompt_tokens"] > 12_000, long
    assert stream["text"] == alone.json()["choices"][0]["message"]["content"]
    during = sum(sent < t < long["first"] for t in stream["times"])
    if knob == "on":
        assert stream["times"][-1] < long["first"], (
            f"with the knob the stream finished beside the prompt's {CHUNK}-token chunks ({during} tokens during it)")
    else:
        assert stream["times"][-1] > long["first"], (
            f"upstream: one token per 1,024-token chunk, the stream outlasts the prefill ({during} tokens during it)")

"""0880 PB_PREFILL_TURNS: a short request sent while a long prompt prefills a chunk a step starts
within two steps with the knob on, and waits for the whole prompt without it (upstream's FIFO
order); the replies are the same either way."""

import threading
import time

import httpx
import pytest

from .conftest import ALL_ON, Server, metric

# A step's token budget small against the long prompt (about 17K tokens): it prefills in about 65 steps
# (about 20 s on this CPU; a short request alone takes about half a second).
ENGINE_ARGS = "--cb-max-batch-tokens 256 --cb-num-blocks 160"
LONG = "Read these notes and say which one repeats. " + " ".join(f"note {i} says item {i * 7 % 1009}."
                                                                   for i in range(1500))


@pytest.fixture(scope="module", params=["off", "on"])
def turns_server(request, patched_engine, trained_model, tmp_path_factory):
    knobs = {**ALL_ON, **({"PB_PREFILL_TURNS": "1"} if request.param == "on" else {})}
    server = Server(patched_engine, trained_model, knobs, tmp_path_factory.mktemp(f"run-turns-{request.param}"),
                    engine_args=ENGINE_ARGS)
    yield request.param, server
    server.stop()


def _long_request(url: str, out: dict) -> None:
    body = {"messages": [{"role": "user", "content": LONG}], "max_tokens": 4, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    text = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = httpx.Response(200, content=line[6:]).json()
            if chunk.get("usage"):
                out["prompt_tokens"] = chunk["usage"]["prompt_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content") and "first" not in out:
                    out["first"] = time.monotonic()
                text.append(choice["delta"].get("content") or "")
    out["text"] = "".join(text)


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
    assert long["prompt_tokens"] > 12_000, long  # more than 45 steps of 256 tokens
    assert "first" in long and long["first"] > sent, "the long prompt was done before the short request came"
    assert short == alone  # which requests shared a step changes nothing a row computes
    if knob == "on":
        assert done < long["first"], "with the knob the short request finished before the long prompt's first token"
    else:
        assert done > long["first"], "upstream's order: the short request waited for the long prompt's prefill"

"""The surface OpenAI- and vLLM-compatible clients expect, against the live engine: served model
names (0590), vLLM's extra fields and legacy functions (0600), OpenAI's reply and stream shapes
(0610). The real `openai` client where it can send the request; httpx for the raw shapes."""

import hashlib
import json
from pathlib import Path

import httpx
import openai
import pytest

from .conftest import ALL_ON, Server

pytestmark = pytest.mark.engine

MESSAGES = [{"role": "user", "content": "Write a function that sums a list of numbers."}]


def post(server, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, timeout=120)


def chat(server, **extra) -> dict:
    r = post(server, {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()


def sse(server, body: dict) -> list:
    events = []
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
    return events


def eos_ids(server) -> list[int]:
    eos = json.loads((Path(server.model) / "config.json").read_text())["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


# ---- served names (0590) ---------------------------------------------------------------------


def test_the_model_is_listed_and_answered_by_its_folder_name_and_never_by_its_path(server_on):
    name = Path(server_on.model).name
    listed = httpx.get(f"{server_on.url}/v1/models", timeout=30)
    assert [m["id"] for m in listed.json()["data"]] == [name]
    assert listed.json()["data"][0]["context_length"] > 0
    assert str(Path(server_on.model).parent) not in listed.text
    client = openai.OpenAI(base_url=f"{server_on.url}/v1", api_key="unused")
    reply = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=4)
    assert reply.model == name
    assert chat(server_on)["model"] == name  # no model named: the served one
    assert chat(server_on, model=server_on.model)["model"] == name  # the path still works, never echoed


def test_an_unknown_model_is_a_404_model_not_found_naming_what_is_served(server_on):
    r = post(server_on, {"model": "gpt-4o", "messages": MESSAGES, "max_tokens": 4})
    assert r.status_code == 404
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_found", "model")
    assert "gpt-4o" in error["message"] and Path(server_on.model).name in error["message"]
    assert str(Path(server_on.model).parent) not in r.text
    client = openai.OpenAI(base_url=f"{server_on.url}/v1", api_key="unused")
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=4)


@pytest.fixture(scope="module")
def named_server(patched_engine, tiny_model, tmp_path_factory):
    s = Server(patched_engine, tiny_model, ALL_ON, tmp_path_factory.mktemp("run-named"),
               served_model_name="glm-tiny,org/glm-alias")
    yield s
    s.stop()


def test_served_model_name_gives_a_name_and_its_aliases(named_server):
    listed = httpx.get(f"{named_server.url}/v1/models", timeout=30).json()
    assert [m["id"] for m in listed["data"]] == ["glm-tiny", "org/glm-alias"]
    assert chat(named_server, model="org/glm-alias")["model"] == "glm-tiny"
    assert post(named_server, {"model": Path(named_server.model).name, "messages": MESSAGES}).status_code == 404
    assert named_server.info["served_as"] == "glm-tiny,org/glm-alias"


def test_with_the_knob_off_the_reply_names_the_path_as_upstream_does(server_off):
    reply = chat(server_off, model=server_off.model)
    assert reply["model"] == f"{server_off.model}@main"


# ---- OpenAI shapes (0610) --------------------------------------------------------------------


def test_ids_and_system_fingerprint_are_openai_shaped(server_on):
    r = post(server_on, {"messages": MESSAGES, "max_tokens": 4})
    reply = r.json()
    assert reply["id"].startswith("chatcmpl-")
    assert reply["system_fingerprint"] == r.headers["x-pb-build"]
    off = chat(server_on, pb_knobs={"PB_OPENAI_SHAPES": 0})
    assert not off["id"].startswith("chatcmpl-")


def test_a_stream_carries_usage_only_when_asked_in_a_last_chunk_without_choices(server_on):
    body = {"messages": MESSAGES, "max_tokens": 6, "stream": True}
    plain = sse(server_on, body)
    assert plain[-1] == "[DONE]"
    assert all("usage" not in json.loads(e) for e in plain[:-1])
    asked = sse(server_on, {**body, "stream_options": {"include_usage": True}})
    last = json.loads(asked[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    assert json.loads(asked[-3])["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in json.loads(e) for e in asked[:-2])
    client = openai.OpenAI(base_url=f"{server_on.url}/v1", api_key="unused")
    chunks = list(client.chat.completions.create(model=Path(server_on.model).name, messages=MESSAGES, max_tokens=6,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []
    upstream = sse(server_on, {**body, "pb_knobs": {"PB_OPENAI_SHAPES": 0}})
    assert "usage" in json.loads(upstream[-2])  # upstream: on the finish chunk, asked or not


def test_max_tokens_over_the_room_left_is_a_400_naming_the_numbers(server_on):
    limit = httpx.get(f"{server_on.url}/v1/models", timeout=30).json()["data"][0]["context_length"]
    r = post(server_on, {"messages": MESSAGES, "max_tokens": limit})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "max_tokens" and str(limit) in error["message"] and "prompt has" in error["message"]
    clamped = post(server_on, {"messages": MESSAGES, "max_tokens": limit, "pb_knobs": {"PB_OPENAI_SHAPES": 0}})
    assert clamped.status_code == 200  # upstream with 0030: shortened without a word


def test_max_output_tokens_over_the_room_left_is_a_400_on_responses_too(server_on):
    """/v1/responses (upstream's handler): a max_output_tokens of a billion ran to the end of the
    context, minutes of work for one request; now refused as chat's max_tokens is."""
    limit = httpx.get(f"{server_on.url}/v1/models", timeout=30).json()["data"][0]["context_length"]
    body = {"model": server_on.model, "input": "Say something about the sea.", "max_output_tokens": 10**9}
    r = httpx.post(f"{server_on.url}/v1/responses", json=body, timeout=60)
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["param"] == "max_output_tokens" and error["code"] == "invalid_value"
    assert str(limit) in error["message"] and "allowed: max_output_tokens <=" in error["message"]
    fits = httpx.post(f"{server_on.url}/v1/responses", json={**body, "max_output_tokens": 4}, timeout=120)
    assert fits.status_code == 200 and fits.json()["usage"]["output_tokens"] <= 4, fits.text[:300]


# ---- vLLM's fields and legacy functions (0600) -----------------------------------------------


def test_ignore_eos_and_min_tokens_hold_back_the_end_of_turn(server_on):
    push_eos = {str(t): 100 for t in eos_ids(server_on)}
    ended = chat(server_on, logit_bias=push_eos)
    assert ended["usage"]["completion_tokens"] == 1 and ended["choices"][0]["finish_reason"] == "stop"
    ignored = chat(server_on, logit_bias=push_eos, ignore_eos=True, max_tokens=8)
    assert ignored["usage"]["completion_tokens"] == 8 and ignored["choices"][0]["finish_reason"] == "length"
    held = chat(server_on, logit_bias=push_eos, min_tokens=5, max_tokens=12)
    assert held["usage"]["completion_tokens"] == 6 and held["choices"][0]["finish_reason"] == "stop"


def test_stop_token_ids_end_the_reply_at_that_token(server_on):
    token = 100
    forced = chat(server_on, logit_bias={str(token): 100}, max_tokens=5)
    assert forced["usage"]["completion_tokens"] == 5
    stopped = chat(server_on, logit_bias={str(token): 100}, max_tokens=5, stop_token_ids=[token])
    assert stopped["usage"]["completion_tokens"] == 1 and stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["message"]["content"] == ""


def test_include_stop_str_in_output_keeps_the_stop_string(server_on):
    text = chat(server_on, max_tokens=24, ignore_eos=True)["choices"][0]["message"]["content"]
    stop = text[6:9]
    assert len(stop) == 3
    at = text.find(stop)
    cut = chat(server_on, max_tokens=24, ignore_eos=True, stop=[stop])["choices"][0]["message"]["content"]
    kept = chat(server_on, max_tokens=24, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    assert cut == text[:at]
    assert kept["choices"][0]["message"]["content"] == text[:at + 3]


def test_repetition_penalty_steers_the_greedy_reply_toward_or_away_from_seen_tokens(server_on):
    def reply(**extra) -> list:
        body = chat(server_on, max_tokens=24, ignore_eos=True, logprobs=True, **extra)
        return [e["bytes"] for e in body["choices"][0]["logprobs"]["content"]]

    plain, rewarded = reply(), reply(repetition_penalty=0.05)
    assert rewarded != plain
    assert len({bytes(b) for b in rewarded}) < 12  # seen tokens' logits x20: it repeats itself
    # A small bias makes the plain reply one token repeated; dividing its logit by 10 once it was
    # seen lets other tokens win.
    nudged = reply(logit_bias={"100": 2})
    penalised = reply(logit_bias={"100": 2}, repetition_penalty=10)
    assert nudged == [nudged[0]] * 24
    assert penalised.count(nudged[0]) <= 12


def test_unknown_fields_are_ignored_and_honoured_ones_checked(server_on):
    assert chat(server_on, use_beam_search=False, spaces_between_special_tokens=True, priority=0)["choices"]
    refused = post(server_on, {"messages": MESSAGES, "use_beam_search": False, "pb_knobs": {"PB_VLLM_FIELDS": 0}})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "unknown_field"
    bad = post(server_on, {"messages": MESSAGES, "ignore_eos": "yes"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "ignore_eos"
    bad = post(server_on, {"messages": MESSAGES, "stop_token_ids": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "stop_token_ids"


def test_legacy_functions_are_served_as_tools(server_on):
    functions = [{"name": "get_weather", "description": "Weather in a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                                 "required": ["city"]}}]
    reply = chat(server_on, functions=functions, function_call={"name": "get_weather"}, max_tokens=64)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and isinstance(json.loads(call["arguments"])["city"], str)
    both = post(server_on, {"messages": MESSAGES, "functions": functions, "tools": [
        {"type": "function", "function": functions[0]}]})
    assert both.status_code == 400 and both.json()["error"]["param"] == "functions"


def test_n_choices_share_the_prompt_blocks_and_each_is_its_seeded_reply_alone(server_on):
    long = " ".join(["def add(a, b): return a + b  # numbers"] * 30)  # over one 256-token block
    base = {"messages": [{"role": "user", "content": long}], "max_tokens": 8, "temperature": 0.9}
    client = openai.OpenAI(base_url=f"{server_on.url}/v1", api_key="unused")
    reply = client.chat.completions.create(model=Path(server_on.model).name, n=3, seed=7, **base)
    texts = [c.message.content for c in reply.choices]
    assert [c.index for c in reply.choices] == [0, 1, 2] and len(set(texts)) == 3
    assert reply.usage.completion_tokens == 24 and reply.usage.prompt_tokens_details.cached_tokens >= 256
    seeds = [7] + [int.from_bytes(hashlib.sha256(f"7/{j}".encode()).digest()[:8], "big") % (1 << 63) for j in (1, 2)]
    alone = [chat(server_on, **{**base, "seed": seed})["choices"][0]["message"]["content"] for seed in seeds]
    assert texts == alone
    events = [json.loads(e) for e in sse(server_on, {**base, "n": 3, "seed": 7, "stream": True})[:-1]]
    streamed = ["", "", ""]
    for event in events:
        for choice in event["choices"]:
            streamed[choice["index"]] += choice["delta"].get("content") or ""
    assert streamed == texts
    assert sorted(c["index"] for e in events for c in e["choices"] if c["finish_reason"]) == [0, 1, 2]


def test_n_is_checked_and_refused_with_a_grammar(server_on):
    r = post(server_on, {"messages": MESSAGES, "n": 17})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    r = post(server_on, {"messages": MESSAGES, "n": 2, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n"
    off = post(server_on, {"messages": MESSAGES, "n": 2, "pb_knobs": {"PB_VLLM_FIELDS": 0}})
    assert off.status_code == 400 and "allowed: 1" in off.json()["error"]["message"]


def test_completions_share_the_shapes_max_tokens_check_and_fingerprint(server_on):
    limit = httpx.get(f"{server_on.url}/v1/models", timeout=30).json()["data"][0]["context_length"]
    r = post(server_on, {"prompt": "def add(a, b):", "max_tokens": limit}, "/v1/completions")
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    ok = post(server_on, {"prompt": "def add(a, b):", "max_tokens": 4}, "/v1/completions")
    assert ok.json()["id"].startswith("cmpl-") and ok.json()["system_fingerprint"] == ok.headers["x-pb-build"]

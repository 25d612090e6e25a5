"""The agent-facing chat API (0070 messages, 0080 parser, 0100 sampling, 0110 forced decoding)
through the `openai` client and httpx against a live server on the tiny model.

The tiny model's weights are random, so replies that must hold a tool call are forced
(`pb_forced`); the model still runs every step. Each knob is also switched off for one
request (`pb_knobs`) to show upstream's behaviour next to it.
"""

import functools
import subprocess
import sys
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from patchbay import ROOT

from .conftest import ALL_ON, Server, engine_code

pytestmark = pytest.mark.engine

WEATHER = {"type": "function", "function": {"name": "weather", "description": "Weather for a city", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "unit": {"type": ["string", "null"]}},
    "required": ["city"]}}}
USER = [{"role": "user", "content": "Weather in Oslo?"}]
FORCED = ("\n<think>The user wants the weather.</think>\nLet me check.\n"
          "<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>0042</arg_value>\n"
          "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n"
          "<arg_key>unit</arg_key>\n<arg_value>null</arg_value>\n</tool_call>")
MARKUP = ("<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>", "<think>", "</think>", "<|")


@pytest.fixture(scope="module")
def agent(patched_engine, tiny_model, tmp_path_factory):
    """The default knob set plus forced decoding (opt-in: a testing facility). Without 0760: its
    tests compare two sends of one request, and a resend that reuses the first's partial block
    computes two prompt rows where the first computed them all; on a CPU torch's products round
    by their row count, so logprobs would differ in their last bits (the GPU's kernels do not)."""
    server = Server(patched_engine, tiny_model, {**ALL_ON, "PB_FORCED_DECODING": "1", "PB_TAIL_REUSE": "0"},
                    tmp_path_factory.mktemp("run-agent"))
    yield server
    server.stop()


def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def chat(server, **kw):
    kw.setdefault("messages", USER)
    kw.setdefault("max_tokens", 120)
    return client(server).chat.completions.create(model=server.model, **kw)


def forced(text=FORCED, **knobs):
    body = {"pb_forced": {"text": text}}
    if knobs:
        body["pb_knobs"] = knobs
    return body


# ---- 0080 PB_GLM_PARSER ---------------------------------------------------------------------


def test_tool_call_reasoning_and_content_are_split(agent):
    r = chat(agent, tools=[WEATHER], extra_body=forced())
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    assert choice.message.reasoning_content == "The user wants the weather."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "weather" and call.id.startswith("call_")
    # Typed by the schema: a string stays "0042", an integer is 3, a nullable is None.
    assert json.loads(call.function.arguments) == {"city": "0042", "days": 3, "unit": None}
    # Forced replies report each token's logprob (teacher forcing).
    assert len(choice.logprobs.content) == r.usage.completion_tokens
    assert all(entry.logprob <= 0 for entry in choice.logprobs.content)


def test_streamed_tool_call_has_the_openai_delta_shape(agent):
    stream = chat(agent, tools=[WEATHER], stream=True, extra_body=forced())
    chunks = [c for c in stream if c.choices]
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    first, rest = calls[0], calls[1:]
    assert (first.index, first.type, first.function.name) == (0, "function", "weather") and first.id
    assert rest and all(tc.index == 0 and tc.id is None and tc.function.name is None for tc in rest)
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == {"city": "0042", "days": 3, "unit": None}
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks)
    assert (content, reasoning) == ("Let me check.", "The user wants the weather.")
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def streamed_calls(stream) -> list[tuple[str, dict]]:
    """A stream's tool calls, from their deltas (the arguments must join to JSON)."""
    names, arguments = {}, {}
    for chunk in stream:
        for tc in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            if tc.function.name:
                names[tc.index] = tc.function.name
            arguments[tc.index] = arguments.get(tc.index, "") + (tc.function.arguments or "")
    return [(names[i], json.loads(arguments[i])) for i in sorted(names)]


# A value holding GLM markup (say, code that writes a call): only `</arg_value>` before the
# call's next part ends it.
MARKUP_VALUE = "x<arg_key>k</arg_key>\n<arg_value>v</arg_value> <tool_call><think>"


def test_markup_inside_an_argument_value_survives(agent):
    text = ("<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>" + MARKUP_VALUE + "</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>")
    expected = [("weather", {"city": MARKUP_VALUE, "days": 3})]
    assert calls(chat(agent, tools=[WEATHER], extra_body=forced(text))) == expected
    assert streamed_calls(chat(agent, tools=[WEATHER], stream=True, extra_body=forced(text))) == expected


def test_parser_off_is_upstream(agent):
    r = chat(agent, tools=[WEATHER], extra_body=forced(PB_GLM_PARSER=0))
    message = r.choices[0].message
    assert message.tool_calls is None and r.choices[0].finish_reason == "stop"
    assert "weather" in message.content and "0042" in message.content  # the call stays text


def test_end_of_turn_tokens_are_never_text(agent):
    # With the parser off too (a non-GLM model), the token that ends the turn is not content.
    body = forced("Plain words.", PB_GLM_PARSER=0)
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(agent, stream=True, extra_body=body)
                       if c.choices)
    assert streamed == text_of(chat(agent, extra_body=body)) == "Plain words."


def test_a_call_cut_by_max_tokens_is_dropped(agent):
    whole = chat(agent, tools=[WEATHER], extra_body=forced())
    cut = whole.usage.completion_tokens - 6  # inside the last argument
    r = chat(agent, tools=[WEATHER], max_tokens=cut, extra_body=forced())
    assert r.choices[0].finish_reason == "length" and r.choices[0].message.tool_calls is None
    assert not any(tag in (r.choices[0].message.content or "") for tag in MARKUP)
    stream = chat(agent, tools=[WEATHER], max_tokens=cut, stream=True, extra_body=forced())
    chunks = [c for c in stream if c.choices]
    assert chunks[-1].choices[0].finish_reason == "length"
    arguments = "".join(tc.function.arguments or "" for c in chunks for tc in (c.choices[0].delta.tool_calls or []))
    with pytest.raises(ValueError):
        json.loads(arguments)  # clients treat a call as final once its arguments parse


def test_no_markup_in_content_of_random_replies(agent):
    for stream in (False, True):
        r = chat(agent, max_tokens=40, stream=stream)
        text = ("".join(c.choices[0].delta.content or "" for c in r if c.choices) if stream
                else r.choices[0].message.content)
        assert not any(tag in text for tag in MARKUP)


# ---- 0070 PB_GLM_MESSAGES -------------------------------------------------------------------


@functools.cache
def tokenizer(model: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model)


def rendered(server, messages, **extra) -> str:
    r = httpx.post(f"{server.url}/tokenize", json={"model": server.model, "messages": messages, **extra},
                   timeout=60)
    assert r.status_code == 200, r.text
    return tokenizer(server.model).decode(r.json()["tokens"])


HISTORY = [
    {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Oslo?"}]},
    {"role": "assistant", "content": "Checking.", "reasoning_content": "Use the tool.",
     "tool_calls": [{"id": "c1", "type": "function",
                     "function": {"name": "weather", "arguments": '{"city": "Oslo", "days": 2}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
]


def test_client_history_renders_as_the_model_wrote_it(agent):
    on = rendered(agent, HISTORY, tools=[WEATHER])
    assert "<|user|>\nWeather in Oslo?" in on  # text parts joined as written
    assert ("<|assistant|>\n<think>Use the tool.</think>\nChecking.\n<tool_call>weather\n"
            "<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
            "<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>") in on
    off = rendered(agent, HISTORY, tools=[WEATHER], pb_knobs={"PB_GLM_MESSAGES": 0})
    assert "Use the tool." not in off and "Checking." not in off  # upstream drops both
    assert "Weather  in Oslo?" in off  # and joins parts with a space


def test_thinking_controls(agent):
    user = [{"role": "user", "content": "Hi"}]
    assert rendered(agent, user, reasoning_effort="none").endswith("<|assistant|>\n<think></think>")
    assert rendered(agent, user, thinking={"type": "disabled"}).endswith("<|assistant|>\n<think></think>")
    assert rendered(agent, user, reasoning_effort="high").endswith("<|assistant|>")
    r = httpx.post(f"{agent.url}/v1/chat/completions", timeout=60,
                   json={"model": agent.model, "messages": user, "reasoning_effort": "extreme"})
    assert r.status_code == 400 and "reasoning_effort" in r.json()["error"]["message"]


def test_keeping_past_thinking_makes_prompts_prefix_stable(agent):
    turn2 = HISTORY + [{"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."},
                       {"role": "user", "content": "Tomorrow?"}]
    kwargs = {"chat_template_kwargs": {"clear_thinking": False}}
    first = rendered(agent, HISTORY, tools=[WEATHER], add_generation_prompt=False, **kwargs)
    second = rendered(agent, turn2, tools=[WEATHER], **kwargs)
    assert second.startswith(first) and "Use the tool." in second
    assert "Use the tool." not in rendered(agent, turn2, tools=[WEATHER])  # GLM's default clears it


def test_malformed_arguments_are_a_400_naming_the_message(agent):
    bad = [HISTORY[0], {**HISTORY[1], "tool_calls": [{"id": "c1", "type": "function",
                                                     "function": {"name": "weather", "arguments": "{city"}}]}]
    with pytest.raises(openai.BadRequestError) as e:
        chat(agent, messages=bad)
    assert "messages[1].tool_calls[0].function.arguments is not valid JSON" in e.value.body["message"]


# ---- 0100 PB_REQUEST_SAMPLING ---------------------------------------------------------------


def text_of(r) -> str:
    return r.choices[0].message.content


def test_seeded_sampling_is_reproducible_alone_or_beside_others(agent):
    alone = text_of(chat(agent, temperature=0.9, seed=7, max_tokens=16))
    assert alone == text_of(chat(agent, temperature=0.9, seed=7, max_tokens=16))
    assert alone != text_of(chat(agent, temperature=0.9, seed=8, max_tokens=16))
    with ThreadPoolExecutor(4) as pool:
        mine = pool.submit(chat, agent, temperature=0.9, seed=7, max_tokens=16)
        others = [pool.submit(chat, agent, temperature=1.3, max_tokens=16) for _ in range(3)]
        assert text_of(mine.result()) == alone
        [o.result() for o in others]


def test_settings_are_per_request_not_frozen(agent):
    greedy = text_of(chat(agent, max_tokens=16))
    chat(agent, temperature=1.5, top_p=0.9, max_tokens=16, extra_body={"top_k": 40})
    assert text_of(chat(agent, max_tokens=16)) == greedy
    assert text_of(chat(agent, temperature=0, max_tokens=16)) == greedy


def test_stop_logprobs_and_penalties(agent):
    greedy = text_of(chat(agent, max_tokens=16))
    stop = greedy[4:7]
    stopped = chat(agent, max_tokens=16, stop=[stop])
    assert stop not in text_of(stopped) and greedy.startswith(text_of(stopped))
    assert stopped.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in chat(agent, max_tokens=16, stop=stop, stream=True)
                       if c.choices)
    assert streamed == text_of(stopped)
    r = chat(agent, max_tokens=5, logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == 5 and all(len(e.top_logprobs) == 3 for e in entries)
    assert all(e.logprob == pytest.approx(e.top_logprobs[0].logprob) for e in entries)  # greedy = the top token
    first = r.choices[0].logprobs.content[0].token
    bias = {str(agent_token_id(agent, first)): -100}
    assert text_of(chat(agent, max_tokens=5, logit_bias=bias)) != text_of(chat(agent, max_tokens=5))


# Characters JSON leaves raw that str.splitlines (and httpx's iter_lines) ends a line on.
LINE_ENDS = {0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"}


def sse_json(value) -> str:
    """What a streamed chunk's JSON must be: json.dumps's compact text, non-ASCII as it is, except
    the three characters a line reader splits on, escaped."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).translate(LINE_ENDS)


def test_line_separators_in_a_reply_do_not_cut_its_stream(agent):
    """A reply holding U+2028, U+2029 and U+0085: read with httpx's iter_lines (which splits where
    str.splitlines does) every data line is whole JSON, and the streamed text is the reply's."""
    text = "one\u2028two\u2029three\x85four and \u2028"
    body = {"model": agent.model, "messages": USER, "max_tokens": 40, "stream": True, **forced(text)}
    with httpx.stream("POST", f"{agent.url}/v1/chat/completions", json=body, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    chunks = [json.loads(line[len("data: "):]) for line in lines]  # a cut line would not parse
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == text
    assert all(not {ord(c) for c in line} & LINE_ENDS.keys() for line in lines), lines
    streamed = chat(agent, max_tokens=40, stream=True, extra_body=forced(text))  # the openai client alike
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == text


def test_streamed_logprobs_chunks_are_json_dumps_bytes_and_the_unstreamed_entries(agent):
    """A stream's chunks are put together from pieces serialized once (the repeated fields once a
    stream, a token's entry once a tokenizer): each must still be the very text sse_json
    writes of what it parses to, and its entries those of the same seeded reply unstreamed.
    The bias pulls in tokens whose text needs escaping or is not ASCII."""
    tok = tokenizer(agent.model)
    odd = ['"', "\\", "\n", "\t", "é", "日本", " \"\\"]
    ids = sorted({i for text in odd for i in tok.encode(text, add_special_tokens=False)})
    body = {"model": agent.model, "messages": USER, "max_tokens": 24, "temperature": 1.0, "seed": 11,
            "logprobs": True, "top_logprobs": 5, "logit_bias": {str(i): 6 for i in ids},
            "stream_options": {"include_usage": True}}
    whole = httpx.post(f"{agent.url}/v1/chat/completions", json=body, timeout=60).json()
    with httpx.stream("POST", f"{agent.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    chunks = [json.loads(line[len("data: "):]) for line in lines]
    for line, chunk in zip(lines[:-1], chunks):  # the last one is the fingerprint's own re-dump
        assert line[len("data: "):] == sse_json(chunk)
    streamed = [e for c in chunks if c["choices"] for e in (c["choices"][0].get("logprobs") or {}).get("content", [])]
    entries = whole["choices"][0]["logprobs"]["content"]
    assert streamed == entries and len(entries) == whole["usage"]["completion_tokens"] == 24
    assert all(len(e["top_logprobs"]) == 5 for e in entries)
    assert any(e["token"] != e["token"].encode("ascii", "ignore").decode() or '"' in e["token"] or "\\" in e["token"]
               for e in entries), entries  # something was escaped or not ASCII
    assert all(bytes(e["bytes"]).decode("utf-8", "replace") == e["token"] for e in entries)


TOKEN_PIECES = """
import json, sys
from transformers import AutoTokenizer
from transformers._pb.api import reply
from patchbay.runtime.synth import padded_tokenizer
bad = []
for tok in (AutoTokenizer.from_pretrained(sys.argv[1]), padded_tokenizer(151_552)):
    for i in range(len(tok)):
        t = reply.token_text(tok, i)
        text = tok.decode([i])
        utf8 = list(text.encode("utf-8"))
        if (t.text, t.utf8, t.head + "-1.5" + t.tail + "}") != (text, utf8, json.dumps(
                {"token": text, "logprob": -1.5, "bytes": utf8}, ensure_ascii=False, separators=(",", ":"),
        ).translate(LINE_ENDS)):
            bad.append(i)
print(json.dumps({"bad": bad[:10], "checked": len(tok)}))
"""


def test_every_token_entry_is_the_tokenizers_decode_in_json(patched_engine, tiny_model):
    """reply.token_text decodes an id straight from the Rust tokenizer and writes its JSON pieces
    by hand: for every id of the tiny model's tokenizer and of air12's padded one, the text is
    tokenizer.decode([id]) and the pieces make json.dumps's entry (line separators escaped)."""
    script = TOKEN_PIECES.replace("sys.argv[1]", repr(str(tiny_model))).replace("LINE_ENDS", repr(LINE_ENDS))
    proc = engine_code(script, patched_engine, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found == {"bad": [], "checked": 151_552}


def agent_token_id(server, text: str) -> int:
    (token,) = tokenizer(server.model).encode(text, add_special_tokens=False)
    return token


def test_penalties_discourage_repeats(agent):
    hi = [{"role": "user", "content": "hi"}]
    greedy = chat(agent, messages=hi, max_tokens=24, logprobs=True)
    ids = [e.token for e in greedy.choices[0].logprobs.content]
    assert len(set(ids)) < len(ids)  # the tiny model repeats itself on this prompt
    penalized = chat(agent, messages=hi, max_tokens=24, logprobs=True, frequency_penalty=2.0, presence_penalty=2.0)
    assert len(set(e.token for e in penalized.choices[0].logprobs.content)) > len(set(ids))


@pytest.mark.parametrize("extra,needle", [
    ({"n": 2, "pb_knobs": {"PB_VLLM_FIELDS": 0}}, "n=2 is not supported"),  # on: n choices (0600)
    ({"temperature": 3}, "temperature=3 is not valid"),
    ({"top_k": -1}, "top_k=-1 is not valid"),
    ({"functions": [{"name": "f"}], "pb_knobs": {"PB_VLLM_FIELDS": 0}}, "unsupported field(s): functions"),
    ({"top_logprobs": 2}, "top_logprobs needs logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop must be"),
    ({"max_tokens": 0}, "max_tokens=0 is not valid"),
    ({"max_tokens": "many"}, "max_tokens='many' is not valid"),
    ({"structured_outputs": ["json"]}, "structured_outputs must be an object"),
])
def test_bad_sampling_fields_are_400s_naming_them(agent, extra, needle):
    r = httpx.post(f"{agent.url}/v1/chat/completions", timeout=60,
                   json={"model": agent.model, "messages": USER, "max_tokens": 4, **extra})
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_sampling_knob_off_is_upstream(agent):
    body = {"model": agent.model, "messages": USER, "max_tokens": 4, "top_k": 5}
    on = httpx.post(f"{agent.url}/v1/chat/completions", json=body, timeout=60)
    off = httpx.post(f"{agent.url}/v1/chat/completions",
                     json={**body, "pb_knobs": {"PB_REQUEST_SAMPLING": 0, "PB_VLLM_FIELDS": 0}},
                     timeout=60)
    # upstream's refusal of an unexpected field (its 422, answered 400 in the OpenAI shape by 0500)
    assert on.status_code == 200 and off.status_code == 400 and off.json()["error"]["code"] == "unknown_field"


# ---- 0110 PB_FORCED_DECODING ----------------------------------------------------------------


def test_forced_replies_queue(agent):
    url = f"{agent.url}/pb/forced"
    assert httpx.delete(url).status_code == 200
    r = httpx.post(url, json={"replies": [{"text": "From the queue.", "when": {"tools": True}}]})
    assert r.json() == {"queued": 1, "pending": 1}
    assert text_of(chat(agent, max_tokens=20)) != "From the queue."  # no tools: not matched
    assert text_of(chat(agent, tools=[WEATHER], max_tokens=20)) == "From the queue."
    assert httpx.get(url).json()["pending"] == 0
    bad = httpx.post(url, json={"replies": [{"text": "x", "tokens": [1]}]})
    assert bad.status_code == 400 and "exactly one of" in bad.json()["error"]["message"]


def test_forced_decoding_off_refuses_the_field(server_on):
    r = httpx.post(f"{server_on.url}/v1/chat/completions", timeout=60,
                   json={"model": server_on.model, "messages": USER, "pb_forced": {"text": "x"},
                         "pb_knobs": {"PB_VLLM_FIELDS": 0}})  # on, 0600 ignores a field it does not know
    assert r.status_code == 400 and r.json()["error"]["code"] == "unknown_field", r.text
    assert httpx.get(f"{server_on.url}/pb/forced").status_code == 404


# ---- 0120 PB_REASONING_FIELD ----------------------------------------------------------------


@pytest.mark.parametrize("policy,fields", [
    ("reasoning_content", {"reasoning_content"}),
    ("reasoning", {"reasoning"}),
    ("both", {"reasoning_content", "reasoning"}),
])
def test_reasoning_field_policy(agent, policy, fields):
    body = {"model": agent.model, "messages": USER, "max_tokens": 120, "tools": [WEATHER],
            **forced(PB_REASONING_FIELD=policy)}
    message = httpx.post(f"{agent.url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]
    assert {k for k in ("reasoning_content", "reasoning") if k in message} == fields
    assert all(message[k] == "The user wants the weather." for k in fields)
    with httpx.stream("POST", f"{agent.url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as r:
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in r.iter_lines()
                  if line.startswith("data: {") and '"choices":[{' in line]
    assert {k for d in deltas for k in ("reasoning_content", "reasoning") if k in d} == fields


def test_usage_counts_reasoning_and_cached_tokens(agent):
    r = chat(agent, tools=[WEATHER], extra_body=forced())
    details = r.usage.completion_tokens_details
    think = len(tokenizer(agent.model).encode("\n<think>The user wants the weather.</think>",
                                                add_special_tokens=False))
    assert 0 < details.reasoning_tokens <= think + 1
    long = [{"role": "user", "content": "Tell me about patches. " * 40}]
    chat(agent, messages=long, max_tokens=2)
    again = chat(agent, messages=long, max_tokens=2)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert again.usage.prompt_tokens_details.cached_tokens < again.usage.prompt_tokens



# ---- 0130 PB_STRUCTURED_OUTPUT --------------------------------------------------------------

CITY = {"type": "object", "additionalProperties": False, "required": ["city", "pop", "kind"],
        "properties": {"city": {"type": "string", "maxLength": 12}, "pop": {"type": "integer", "minimum": 0,
                                                                           "maximum": 99},
                       "kind": {"enum": ["town", "city"]}}}
ASK = [{"role": "user", "content": "Give me a city."}]


def schema_format(schema=CITY) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}


def valid_city(text: str) -> dict:
    value = json.loads(text)
    assert set(value) == {"city", "pop", "kind"} and isinstance(value["city"], str) and len(value["city"]) <= 12
    assert isinstance(value["pop"], int) and 0 <= value["pop"] <= 99 and value["kind"] in ("town", "city")
    return value


def test_json_schema_replies_follow_the_schema(agent):
    r = chat(agent, messages=ASK, max_tokens=60, response_format=schema_format())
    valid_city(r.choices[0].message.content)
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].delta.content or "" for c in
                       chat(agent, messages=ASK, max_tokens=60, response_format=schema_format(), stream=True)
                       if c.choices)
    assert streamed == r.choices[0].message.content
    # vLLM's spellings of the same constraint give the same reply.
    for extra in ({"guided_json": CITY}, {"structured_outputs": {"json": CITY}}):
        assert text_of(chat(agent, messages=ASK, max_tokens=60, extra_body=extra)) == text_of(r)


def test_a_constrained_reply_is_the_same_alone_or_beside_three_others(agent):
    alone = text_of(chat(agent, messages=ASK, max_tokens=60, response_format=schema_format()))
    with ThreadPoolExecutor(4) as pool:
        mine = pool.submit(chat, agent, messages=ASK, max_tokens=60, response_format=schema_format())
        others = [pool.submit(chat, agent, max_tokens=60, temperature=1.0) for _ in range(3)]
        assert text_of(mine.result()) == alone
        [o.result() for o in others]


def test_other_constraint_kinds(agent):
    close = {str(agent_token_id(agent, "}")): 10}  # a nudge to close the object early
    obj = chat(agent, messages=ASK, max_tokens=60, response_format={"type": "json_object"}, logit_bias=close)
    assert isinstance(json.loads(text_of(obj)), dict)
    assert text_of(chat(agent, messages=ASK, max_tokens=10, extra_body={"guided_choice": ["yes", "no"]})) in ("yes",
                                                                                                          "no")
    regex = text_of(chat(agent, messages=ASK, max_tokens=20, extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}}))
    assert len(regex) == 6 and regex[:3].isdigit() and regex[3] == "-" and regex[4:].isalpha()


@pytest.mark.parametrize("schema,needle", [
    ({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}},
     "schema keyword 'uniqueItems' at $.properties.tags cannot be enforced"),
    ({"not": {"type": "string"}}, "schema keyword 'not' at $ cannot be enforced"),
    ({"type": "string", "format": "credit-card"}, "format 'credit-card' at $ cannot be enforced"),
    ({"type": "number", "multipleOf": 0.5}, "schema keyword 'multipleOf' at $ cannot be enforced"),
])
def test_unenforceable_schemas_are_refused_by_name(agent, schema, needle):
    with pytest.raises(openai.BadRequestError) as e:
        chat(agent, messages=ASK, response_format=schema_format(schema))
    assert needle in e.value.body["message"]


def test_bad_constraints_are_400s(agent):
    for extra, needle in [({"guided_json": CITY, "response_format": {"type": "json_object"}}, "give one"),
                          ({"guided_regex": "[unclosed"}, "could not be compiled"),
                          ({"response_format": {"type": "yaml"}}, "response_format.type must be")]:
        r = httpx.post(f"{agent.url}/v1/chat/completions", timeout=60,
                       json={"model": agent.model, "messages": ASK, "max_tokens": 5, **extra})
        assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_structured_output_knob_off_is_upstream(agent):
    body = {"response_format": schema_format(), "pb_knobs": {"PB_STRUCTURED_OUTPUT": 0}}
    text = text_of(chat(agent, messages=ASK, max_tokens=20, extra_body=body))
    with pytest.raises(ValueError):
        json.loads(text)  # upstream ignores response_format


# ---- 0140 PB_TOOL_CHOICE --------------------------------------------------------------------

NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
BOUNDED = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}


def calls(r) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in r.choices[0].message.tool_calls or []]


def tool_chat(agent, **kw):
    # The random model would think forever; with thinking off the grammar applies at once.
    return chat(agent, tools=[BOUNDED, NOW], reasoning_effort="none", max_tokens=80, **kw)


def test_tool_choice_required_and_named_are_enforced(agent):
    required = calls(tool_chat(agent, tool_choice="required"))
    assert required and all(name in ("weather", "now") for name, _ in required)
    named = tool_chat(agent, tool_choice={"type": "function", "function": {"name": "weather"}})
    ((name, args),) = calls(named)
    assert name == "weather" and named.choices[0].finish_reason == "tool_calls"
    assert isinstance(args["city"], str) and 1 <= args["days"] <= 7
    assert calls(tool_chat(agent, tool_choice={"type": "function", "function": {"name": "now"}})) == [("now", {})]
    single = tool_chat(agent, tool_choice="required", parallel_tool_calls=False)
    assert len(calls(single)) == 1 and single.choices[0].finish_reason == "tool_calls"


def test_a_tool_grammar_s_padding_is_not_part_of_a_value(agent):
    # xgrammar's GLM structure admits one whitespace character just inside each side of a value;
    # a reply that uses it (forced here, under a named tool_choice) still meets maxLength and enum.
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}}}}}
    text = ("<tool_call>weather<arg_key>city</arg_key><arg_value>Copenhagen12\n</arg_value>"
            "<arg_key>unit</arg_key><arg_value> c</arg_value></tool_call>")
    # (0140 alone: 0150's tight grammar admits no such padding.)
    kw = {"tools": [tool], "tool_choice": {"type": "function", "function": {"name": "weather"}},
          "reasoning_effort": "none", "extra_body": forced(text, PB_THINKING_BUDGET=0)}
    expected = [("weather", {"city": "Copenhagen12", "unit": "c"})]
    assert calls(chat(agent, **kw)) == expected
    assert streamed_calls(chat(agent, stream=True, **kw)) == expected
    # Without a grammar the same reply is read as written; so is it under 0150's grammar, which
    # leaves no room for padding (the forced reply here goes around the grammar).
    as_written = [("weather", {"city": "Copenhagen12\n", "unit": " c"})]
    assert calls(chat(agent, **{**kw, "tool_choice": "auto"})) == as_written
    assert calls(chat(agent, **{**kw, "extra_body": forced(text)})) == as_written


def test_tool_choice_none_forbids_calls(agent):
    opener = {str(agent_token_id(agent, "<tool_call>")): 100}
    assert calls(tool_chat(agent, logit_bias=opener))  # the nudge alone makes a call (auto)
    r = tool_chat(agent, logit_bias=opener, tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "<tool_call>" not in (r.choices[0].message.content or "")


def test_a_strict_tool_is_constrained_wherever_it_is_called(agent):
    opener = {str(agent_token_id(agent, "<tool_call>")): 100}  # make the model open a call (auto)
    strict = {"type": "function", "function": {**BOUNDED["function"], "strict": True}}
    r = chat(agent, tools=[strict], reasoning_effort="none", max_tokens=80, logit_bias=opener)
    ((name, args),) = calls(r)[:1]
    assert name == "weather" and isinstance(args["city"], str) and 1 <= args["days"] <= 7


def test_bad_tool_choices_are_400s(agent):
    for kw, needle in [
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "names 'nope', which is not among"),
        ({"tool_choice": "sometimes"}, "tool_choice must be none, auto, required"),
    ]:
        with pytest.raises(openai.BadRequestError) as e:
            tool_chat(agent, **kw)
        assert needle in e.value.body["message"]
    loose = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "x": {"type": "array", "uniqueItems": True}}}}}
    with pytest.raises(openai.BadRequestError) as e:
        chat(agent, tools=[loose], tool_choice="required")
    assert "tools[f].parameters: schema keyword 'uniqueItems' at $.properties.x" in e.value.body["message"]


def test_tool_choice_knob_off_is_upstream(agent):
    r = tool_chat(agent, tool_choice="required", extra_body={"pb_knobs": {"PB_TOOL_CHOICE": 0}})
    assert r.choices[0].message.tool_calls is None  # upstream does not enforce it


def test_teacher_forced_score_through_the_server(agent, patched_engine, tiny_model, tmp_path):
    """`patchbay score --url`: each reference reply forced through the served engine's decode
    path gives the same logprobs as the in-process teacher-forced forward (plus the end token);
    sent all at once (batched) they stay at float rounding."""
    from patchbay.measure import exact
    from patchbay.runtime import launch

    served = exact.score_served(agent.url, tiny_model)
    local = exact.score_engine(launch.engine_env(patched_engine, {}), tiny_model)
    assert len(served["logprobs"]) == len(local["logprobs"]) == 4
    for s, t in zip(served["logprobs"], local["logprobs"]):
        assert len(s) == len(t) + 1 and len(t) > 100  # the forced end-of-turn token comes last
        assert max(abs(a - b) for a, b in zip(s, t)) < 1e-3
    out = tmp_path / "together.json"
    proc = subprocess.run([sys.executable, "-m", "patchbay", "score", "--url", agent.url, "--together",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert summary["tokens"] == sum(map(len, served["logprobs"])) and len(summary["texts"]) == 4
    assert summary["max_abs"] < 1e-3


def test_score_through_a_server_without_forced_decoding_says_so(server_on):
    proc = subprocess.run([sys.executable, "-m", "patchbay", "score", "--url", server_on.url, "--together"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1 and "PB_FORCED_DECODING=1" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ---- 0720 PB_REPLY_PROCESS ------------------------------------------------------------------


def offloaded_events(server, body: dict, knob: int) -> list:
    """A streamed chat reply's events with PB_REPLY_PROCESS at `knob` for the request (the
    per-request id and time taken out, tool call ids as whether they have their shape);
    `[DONE]` as its text."""
    knobs = {**body.get("pb_knobs", {}), "PB_REPLY_PROCESS": knob}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=300,
                      json={"model": server.model, **body, "stream": True, "pb_knobs": knobs}) as r:
        assert r.status_code == 200, r.read()
        text = r.read().decode()
    events = []
    for line in text.split("\n"):
        if line.startswith("data: {"):
            event = json.loads(line[6:])
            event.pop("id", None), event.pop("created", None)
            for choice in event.get("choices", []):
                for call in choice.get("delta", {}).get("tool_calls") or []:
                    if "id" in call:  # a hash of the request's id
                        call["id"] = call["id"].startswith("call_")
            events.append(event)
        elif line.startswith("data: "):
            events.append(line[6:])
    return events


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 6}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.mark.parametrize("body", [
    {"messages": USER, "tools": [WEATHER], "logprobs": True, "top_logprobs": 3,
     "stream_options": {"include_usage": True}, **forced()},
    {"messages": USER, "max_tokens": 24, "temperature": 0.8, "top_p": 0.95, "seed": 7, "logprobs": True,
     "top_logprobs": 5, "ignore_eos": True},
    {"messages": USER, "stop": ["check"], **forced()},
    {"messages": USER, "max_tokens": 40, "temperature": 0,
     "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}},
], ids=["forced-call-logprobs-usage", "seeded-top5", "stop-string", "json-schema"])
def test_reply_process_streams_the_same_events(agent, body):
    """The reply process renders what the server renders: every event the same, the fingerprint
    stamped on the last (the request's id and time aside)."""
    inside, offloaded = offloaded_events(agent, body, 0), offloaded_events(agent, body, 1)
    assert offloaded == inside
    assert inside[-1] == "[DONE]" and len(inside) >= 4
    assert any("pb_fingerprint" in e for e in inside if isinstance(e, dict))


def test_reply_process_streams_beside_each_other_as_alone(agent):
    """Eight offloaded seeded streams at once: each the tokens of that request alone with the knob
    off, event for event (on a CPU a batched row's logits may differ in their last bits, so the
    logprobs are compared to 1e-4)."""
    bodies = [{"messages": [{"role": "user", "content": f"Stream {i}: name a sorting algorithm."}],
               "max_tokens": 16, "temperature": 0.9, "seed": 100 + i, "logprobs": True, "top_logprobs": 2,
               "ignore_eos": True} for i in range(8)]

    def tokens_of(events):
        out = []
        for e in events[:-1]:
            choice = (e["choices"] or [{}])[0]
            entries = (choice.get("logprobs") or {}).get("content") or []
            out.append((choice.get("delta"), e.get("pb_fingerprint"),
                        [(x["token"], [t["token"] for t in x["top_logprobs"]]) for x in entries],
                        [x["logprob"] for x in entries]))
        return out

    alone = [tokens_of(offloaded_events(agent, b, 0)) for b in bodies]
    with ThreadPoolExecutor(8) as pool:
        together = [tokens_of(e) for e in pool.map(lambda b: offloaded_events(agent, b, 1), bodies)]
    assert len({str(a) for a in alone}) == 8  # eight different replies
    for mine, theirs in zip(together, alone):
        assert [m[:3] for m in mine] == [t[:3] for t in theirs]
        assert all(abs(a - b) < 1e-4 for m, t in zip(mine, theirs) for a, b in zip(m[3], t[3]))


def test_reply_process_reports_the_cached_prompt_tokens(agent):
    """A streamed reply's usage says how much of its prompt the prefix cache held, with the reply
    process rendering it as without (the server counts; the reply process only writes it)."""
    long = [{"role": "user", "content": "Tell me about reply processes. " * 40}]
    body = {"messages": long, "max_tokens": 2, "stream_options": {"include_usage": True}}
    usages = [[e["usage"] for e in offloaded_events(agent, body, knob)[:-1] if e.get("usage")][-1]
              for knob in (0, 1, 1)]
    cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
    assert 0 < cached[1] < usages[1]["prompt_tokens"], usages
    assert cached[1] == cached[2], usages


def test_a_failed_reply_ends_its_stream_with_an_error_event(patched_engine, tiny_model):
    """The in-server rendering of a stream whose reply failed: the chunk's events, then the error
    event, and the stream reported failed (a step that runs out of GPU memory ends streams so)."""
    code = f"""
import json
from transformers import AutoTokenizer
from transformers._pb.api import chat
from transformers._pb.api.reply import Reply
reply = Reply("r1", AutoTokenizer.from_pretrained({tiny_model!r}), [1, 2, 3], None, None, 8, parse=False)
reply.error = "the step ran out of memory"
print(json.dumps(chat.stream_step(chat._Chunks("r1", "m", 0), reply, [], 0)))
"""
    proc = engine_code(code, patched_engine)
    assert proc.returncode == 0, proc.stderr[-2000:]
    text, failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failed and text.endswith('data: {"error": "the step ran out of memory"}\n\n'), text


def reply_processes(server) -> list[int]:
    """The pids of the server's reply processes (its children running 0720's module)."""
    from pathlib import Path

    server_pid = server.files.pids()[0]
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"_pb.api.reply_process" in cmdline and ppid == server_pid:
            found.append(int(proc.name))
    return found


def test_a_reply_process_that_dies_ends_its_streams_not_the_server(agent):
    """Killed mid-stream, the reply process takes its stream down with an error event; the server
    keeps serving, and the next offloaded stream starts a new one."""
    import os
    import signal

    offloaded_events(agent, {"messages": USER, "max_tokens": 2}, 1)  # one is running now
    (pid,) = reply_processes(agent)
    body = {"model": agent.model, "messages": USER, "max_tokens": 400, "ignore_eos": True, "stream": True,
            "pb_knobs": {"PB_REPLY_PROCESS": 1}}
    with httpx.stream("POST", f"{agent.url}/v1/chat/completions", json=body, timeout=300) as r:
        lines = r.iter_lines()
        seen = [next(lines) for _ in range(6)]  # the role event and a few tokens' (and blank lines)
        os.kill(pid, signal.SIGKILL)
        rest = list(lines)
    events = [line[6:] for line in seen + rest if line.startswith("data: ")]
    errors = [json.loads(e)["error"] for e in events if e.startswith('{"error"')]
    assert errors and "reply process ended" in errors[0], events[-3:]
    assert len(events) < 400  # it stopped there, not after the whole reply
    # The server still answers, in-process and offloaded (a new reply process).
    assert offloaded_events(agent, {"messages": USER, "max_tokens": 3}, 0)[-1] == "[DONE]"
    assert offloaded_events(agent, {"messages": USER, "max_tokens": 3}, 1)[-1] == "[DONE]"
    assert reply_processes(agent) and pid not in reply_processes(agent)


def test_after_three_ended_reply_processes_the_server_renders_streams_itself(patched_engine, tiny_model, tmp_path):
    """A reply process that keeps ending costs its streams, not every stream after it: after the
    third, the server renders streams itself (the same events) and starts no other."""
    import os
    import signal
    import time

    server = Server(patched_engine, tiny_model, ALL_ON, tmp_path / "run")
    try:
        body = {"messages": USER, "max_tokens": 3}
        for ended in range(1, 4):
            assert offloaded_events(server, body, 1)[-1] == "[DONE]"
            (pid,) = reply_processes(server)
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while server.files.log.read_text().count("reply process ended") < ended:
                assert time.monotonic() < deadline, "the server did not notice the reply process end"
                time.sleep(0.2)
        assert "rendered in the server from now on" in server.files.log.read_text()
        assert offloaded_events(server, body, 1) == offloaded_events(server, body, 0)
        assert reply_processes(server) == []
    finally:
        server.stop()

"""0150 PB_THINKING_BUDGET: replies that think for a bounded number of tokens, tight grammars,
and tool_choice required ending after its calls.

The tiny model's weights are random; `logit_bias` in favour of `<think>` makes it open its
thinking and think forever (every token another `<think>`), as the random air12 replies did
through the API. With a budget the reply still ends within max_tokens, with its JSON or its
tool call; with the knob off (per request) it runs out of tokens thinking, as before.
"""

import json
import re

import httpx
import pytest
import torch

from patchbay.runtime import synth

from .conftest import engine_module

pytestmark = pytest.mark.engine

ASK = [{"role": "user", "content": "Give me a city."}]
# Enums and integers only: a free string value could hold `<think>` tokens too.
CITY = {"type": "object", "additionalProperties": False, "required": ["city", "pop"],
        "properties": {"city": {"enum": ["Oslo", "Bergen"]}, "pop": {"type": "integer", "minimum": 0, "maximum": 99}}}
WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city", "days"],
    "properties": {"city": {"enum": ["Oslo", "Bergen"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}
NOW = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
OFF = {"PB_THINKING_BUDGET": 0}


@pytest.fixture(scope="module")
def ids(tok):
    return {t: tok.convert_tokens_to_ids(t) for t in synth.SPECIAL_TOKENS}


def post(server, ids, **kw):
    body = {"model": server.model, "messages": ASK, "max_tokens": 200,
            "logit_bias": {str(ids["<think>"]): 100}, "logprobs": True, **kw}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def tokens(choice) -> list[str]:
    return [e["token"] for e in choice["logprobs"]["content"]]


# ---- through the API -------------------------------------------------------------------------


def test_a_json_reply_that_would_think_forever_still_answers(server_on, ids):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    choice = post(server_on, ids, response_format=fmt)
    assert choice["finish_reason"] == "stop"
    text = choice["message"]["content"]
    value = json.loads(text)
    assert value["city"] in ("Oslo", "Bergen") and 0 <= value["pop"] <= 99
    assert text == json.dumps(value, separators=(",", ":"))  # tight: no space after "," or ":"
    seen = tokens(choice)
    assert seen[:101] == ["<think>"] * 101 and seen[101] == "</think>"  # 100 = half of max_tokens
    old = post(server_on, ids, response_format=fmt, pb_knobs=OFF)
    assert old["finish_reason"] == "length" and not old["message"]["content"]  # thought until the end


@pytest.mark.parametrize("parallel", [True, False])
def test_required_tool_calls_end_the_turn(server_on, ids, parallel):
    choice = post(server_on, ids, tools=[WEATHER, NOW], tool_choice="required", parallel_tool_calls=parallel)
    assert choice["finish_reason"] == "tool_calls"
    calls = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in choice["message"]["tool_calls"]]
    assert calls and all(name in ("weather", "now") for name, _ in calls)
    assert parallel or len(calls) == 1
    old = post(server_on, ids, tools=[WEATHER, NOW], tool_choice="required", parallel_tool_calls=parallel,
               pb_knobs=OFF)
    assert old["finish_reason"] == "length" and not old["message"].get("tool_calls")


def test_a_named_function_ends_the_turn(server_on, ids):
    named = {"type": "function", "function": {"name": "weather"}}
    choice = post(server_on, ids, tools=[WEATHER, NOW], tool_choice=named)
    assert choice["finish_reason"] == "tool_calls"
    ((call,),) = [choice["message"]["tool_calls"]]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "weather" and args["city"] in ("Oslo", "Bergen") and 1 <= args["days"] <= 7


def test_reasoning_effort_picks_the_budget_of_a_plain_reply(server_on, ids):
    low = tokens(post(server_on, ids, max_tokens=40, reasoning_effort="low"))  # min(512, 40 // 2)
    assert low[:21] == ["<think>"] * 21 and low[21] == "</think>"
    forced_at = tokens(post(server_on, ids, max_tokens=40, pb_knobs={"PB_THINKING_BUDGET": 5}))
    assert forced_at[:6] == ["<think>"] * 6 and forced_at[6] == "</think>"  # no effort: the knob's value
    assert "</think>" not in tokens(post(server_on, ids, max_tokens=40, pb_knobs=OFF))
    # none: the template closes the thinking in the prompt; the reply has none to budget.
    assert "</think>" not in tokens(post(server_on, ids, max_tokens=10, reasoning_effort="none"))


def test_an_unknown_reasoning_effort_is_a_400(server_on):
    r = httpx.post(f"{server_on.url}/v1/chat/completions", timeout=60,
                   json={"model": server_on.model, "messages": ASK, "max_tokens": 5, "reasoning_effort": "extreme"})
    assert r.status_code == 400 and "reasoning_effort" in r.json()["error"]["message"]


# ---- the pieces, driven directly -------------------------------------------------------------


@pytest.fixture
def engine(patched_engine):
    # Per test, and with no request's overrides left in this thread's context: the knobs read here
    # are exactly these, whatever ran in this process before.
    knobs = engine_module(patched_engine, "knobs")
    knobs.load({"PB_THINKING_BUDGET": "300", "PB_TOOL_CHOICE": "1", "PB_STRUCTURED_OUTPUT": "1"})
    token = knobs._request_overrides.set(None)
    yield {name: engine_module(patched_engine, f"api.{name}") for name in ("grammar", "thinking")}
    knobs._request_overrides.reset(token)
    knobs.load({})


def test_reasoning_effort_maps_to_budgets(engine):
    budget = engine["thinking"].budget_for
    assert [budget(e, 100_000) for e in ("none", "minimal", "low", "medium", "high")] == [0, 0, 512, 2048, 8192]
    assert budget(None, 100_000) == 300  # the knob's value
    assert budget("high", 1000) == 500 and budget(None, 100) == 50  # at most half of max_tokens


class Spec:
    def __init__(self):
        self.tokens = []


def allowed(mask, spec, vocab) -> set:
    scores = mask(spec, torch.zeros(vocab))
    return set(torch.nonzero(torch.isfinite(scores)).flatten().tolist())


def test_the_budget_forces_the_end_of_thinking_then_lets_go(engine, tok, ids):
    grammar, thinking = engine["grammar"], engine["thinking"]
    budget = thinking.Budget(lambda: grammar.Constraint(None, tok, len(tok), "pre"), ids["</think>"], 3)
    spec = Spec()
    for token in [ids["<think>"], 100, 200, 300]:  # opens its thinking, thinks 3 tokens
        assert len(allowed(budget, spec, len(tok))) == len(tok)
        spec.tokens.append(token)
    assert allowed(budget, spec, len(tok)) == {ids["</think>"]}
    spec.tokens.append(ids["</think>"])
    assert len(allowed(budget, spec, len(tok))) == len(tok)
    other = budget.fresh()  # another choice starts its own count
    assert other.began is None and other.inner is not budget.inner


def tool_matcher(engine, tok, ids, choice, parallel=True):
    import xgrammar as xgr

    grammar, thinking = engine["grammar"], engine["thinking"]
    functions = [{"type": "function", "function": t["function"]} for t in (WEATHER, NOW)]
    tag = xgr.get_model_structural_tag("glm_4_7", tools=functions, tool_choice=choice, reasoning="disabled",
                                       parallel_tool_calls=parallel, max_whitespace_cnt=1)
    comp = grammar.compiler(tok, len(tok), [ids["<|endoftext|>"]])
    compiled = thinking.compile_tool_tag(comp, tag, parallel, [ids["<tool_call>"], ids["</tool_call>"]])
    return xgr.GrammarMatcher(compiled)


def accepts(matcher, tok, ids, text: str, end=True) -> bool:
    """Whether the grammar takes text (its markers as their own tokens) and then the end of the turn."""
    pieces = re.split(r"(<tool_call>|</tool_call>)", text)
    for piece in pieces:
        if piece in ("<tool_call>", "</tool_call>"):
            ok = matcher.accept_token(ids[piece])
        else:
            ok = not piece or matcher.accept_string(piece)
        if not ok:
            return False
    return matcher.accept_token(ids["<|endoftext|>"]) if end else True


CALL = "<tool_call>weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"


def test_tool_values_are_tight_and_nothing_follows_the_calls(engine, tok, ids):
    def ok(text, choice="required", parallel=True):
        return accepts(tool_matcher(engine, tok, ids, choice, parallel), tok, ids, text)

    assert ok(CALL) and ok(CALL + CALL) and ok("<tool_call>now</tool_call>")
    assert not ok(CALL + CALL, parallel=False) and ok(CALL, parallel=False)
    assert not ok(CALL + "and then some text")  # the turn ends after the calls
    # GLM-4.5 writes a newline between a call's parts: still taken.
    assert ok(CALL.replace("weather<arg_key>", "weather\n<arg_key>").replace("</arg_key><arg_value>",
                                                                             "</arg_key>\n<arg_value>"))
    # Nothing around a value: no padding the parser would have to drop.
    assert not ok(CALL.replace("<arg_value>Oslo", "<arg_value> Oslo"))
    assert not ok(CALL.replace("Oslo</arg_value>", "Oslo\n</arg_value>"))
    assert not ok(CALL.replace("<arg_value>3", "<arg_value> 3"))
    # The markers are the special tokens, never spelled in pieces.
    assert not tool_matcher(engine, tok, ids, "required").accept_string("<tool_call>")
    named = {"type": "function", "function": {"name": "weather"}}
    assert ok(CALL, named) and not ok(CALL + CALL, named)


def test_json_values_inside_a_call_are_tight(engine, tok, ids):
    import xgrammar as xgr

    grammar, thinking = engine["grammar"], engine["thinking"]
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "o": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array",
                                                                              "items": {"type": "integer"}}}}}}}}
    tag = xgr.get_model_structural_tag("glm_4_7", tools=[tool], tool_choice="required", reasoning="disabled",
                                       max_whitespace_cnt=1)
    comp = grammar.compiler(tok, len(tok), [ids["<|endoftext|>"]])
    compiled = thinking.compile_tool_tag(comp, tag, True, [ids["<tool_call>"], ids["</tool_call>"]])

    def ok(value):
        return accepts(xgr.GrammarMatcher(compiled), tok, ids,
                       f"<tool_call>f<arg_key>o</arg_key><arg_value>{value}</arg_value></tool_call>")

    assert ok('{"a":1,"b":[1,2]}')
    assert not ok('{"a": 1, "b": [1, 2]}') and not ok('{ "a":1}')


def test_json_replies_are_tight(engine, tok, ids):
    import xgrammar as xgr

    grammar = engine["grammar"]
    comp = grammar.compiler(tok, len(tok), [ids["<|endoftext|>"]])
    compiled = grammar.compile_body(comp, "json", CITY, "response_format")

    def ok(text):
        m = xgr.GrammarMatcher(compiled)
        return m.accept_string(text) and m.accept_token(ids["<|endoftext|>"])

    assert ok('{"city":"Oslo","pop":3}')
    assert not ok('{"city": "Oslo", "pop": 3}') and not ok('{"city":"Oslo" ,"pop":3}')


def test_a_call_that_would_not_fit_is_not_begun(engine, tok, ids):
    grammar, thinking = engine["grammar"], engine["thinking"]
    call = [ids["<tool_call>"], *tok.encode(CALL[len("<tool_call>"):-len("</tool_call>")], add_special_tokens=False),
            ids["</tool_call>"]]
    import xgrammar as xgr

    functions = [{"type": "function", "function": t["function"]} for t in (WEATHER, NOW)]
    tag = xgr.get_model_structural_tag("glm_4_7", tools=functions, tool_choice="required", reasoning="disabled",
                                       max_whitespace_cnt=1)
    comp = grammar.compiler(tok, len(tok), [ids["<|endoftext|>"]])
    compiled = thinking.compile_tool_tag(comp, tag, True, [ids["<tool_call>"], ids["</tool_call>"]])
    end = ids["<|endoftext|>"]
    for room, may_call_again in ((2 * len(call) + 1, True), (2 * len(call), False)):
        mask = thinking.Budget(lambda: grammar.Constraint(compiled, tok, len(tok), "body"), ids["</think>"], 0,
                               max_new_tokens=room, stops=[end])
        spec = Spec()
        for token in call:
            assert token in allowed(mask, spec, len(tok))
            spec.tokens.append(token)
        after = allowed(mask, spec, len(tok))
        assert end in after and (ids["<tool_call>"] in after) == may_call_again

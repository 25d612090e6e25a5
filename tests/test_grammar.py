"""The structured-output machinery of the patched engine (0130, 0140), driven directly:
which JSON Schema keywords xgrammar enforces, and the mask's thinking phases.

`ENFORCED` in the engine is a promise: every keyword in it is checked here against a text
that violates it and one that satisfies it, so an xgrammar upgrade that stops enforcing one
fails this test instead of silently letting replies through.
"""

import json

import pytest
import torch


pytestmark = pytest.mark.engine

# keyword -> (schema, a text that violates it, a text that satisfies it)
CASES = {
    "type": ({"type": "integer"}, '"a"', "3"),
    "properties": ({"type": "object", "properties": {"a": {"type": "integer"}}}, '{"a":"x"}', '{"a":1}'),
    "required": ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, "{}", '{"a":1}'),
    "additionalProperties": ({"type": "object", "properties": {"a": {"type": "integer"}},
                              "additionalProperties": False}, '{"b":1}', '{"a":1}'),
    "items": ({"type": "array", "items": {"type": "integer"}}, '["a"]', "[1,2]"),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, '["a"]', "[1]"),
    "enum": ({"enum": ["a", "b"]}, '"c"', '"a"'),
    "const": ({"const": "a"}, '"c"', '"a"'),
    "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "true", "1"),
    "oneOf": ({"oneOf": [{"type": "integer"}, {"type": "string"}]}, "true", '"x"'),
    "$ref": ({"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x"}, '"a"', "4"),
    "$defs": ({"type": "object", "properties": {"p": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "integer"}}},
              '{"p":"a"}', '{"p":3}'),
    "definitions": ({"type": "object", "properties": {"p": {"$ref": "#/definitions/x"}},
                     "definitions": {"x": {"type": "integer"}}}, '{"p":"a"}', '{"p":3}'),
    "minLength": ({"type": "string", "minLength": 3}, '"ab"', '"abc"'),
    "maxLength": ({"type": "string", "maxLength": 3}, '"abcd"', '"abc"'),
    "pattern": ({"type": "string", "pattern": "^a+$"}, '"b"', '"aa"'),
    "format": ({"type": "string", "format": "date"}, '"hello"', '"2024-01-02"'),
    "minimum": ({"type": "integer", "minimum": 5}, "3", "6"),
    "maximum": ({"type": "integer", "maximum": 5}, "7", "4"),
    "exclusiveMinimum": ({"type": "number", "exclusiveMinimum": 0}, "0", "0.5"),
    "exclusiveMaximum": ({"type": "number", "exclusiveMaximum": 5}, "5.0", "4.5"),
    "minItems": ({"type": "array", "minItems": 2}, "[1]", "[1,2]"),
    "maxItems": ({"type": "array", "maxItems": 1}, "[1,2]", "[1]"),
    "minProperties": ({"type": "object", "minProperties": 1}, "{}", '{"a":1}'),
    "maxProperties": ({"type": "object", "maxProperties": 1}, '{"a":1,"b":2}', '{"a":1}'),
    "propertyNames": ({"type": "object", "propertyNames": {"pattern": "^a"}}, '{"b":1}', '{"a":1}'),
}


@pytest.fixture(scope="module")
def comp(grammar, tok):
    return grammar.compiler(tok, len(tok), [tok.convert_tokens_to_ids("<|endoftext|>")])


def complete(comp, tok, schema, text) -> bool:
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(comp.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                          strict_mode=False))
    text = json.dumps(json.loads(text))  # the server's compact JSON still spaces ": " and ", "
    return matcher.accept_string(text) and matcher.accept_token(tok.convert_tokens_to_ids("<|endoftext|>"))


def test_every_keyword_called_enforced_is_enforced(grammar, comp, tok):
    assert set(CASES) == grammar.ENFORCED
    for keyword, (schema, bad, good) in CASES.items():
        grammar.check_schema(schema, "test")  # accepted by the server's check ...
        assert complete(comp, tok, schema, good), keyword
        assert not complete(comp, tok, schema, bad), f"{keyword} is not enforced"  # ... and enforced


def test_integer_multiple_of_is_enforced_and_number_multiple_of_is_refused(grammar, comp, tok):
    assert not complete(comp, tok, {"type": "integer", "multipleOf": 3}, "4")
    assert complete(comp, tok, {"type": "number", "multipleOf": 0.5}, "0.3")  # xgrammar ignores it ...
    with pytest.raises(Exception, match="multipleOf"):
        grammar.check_schema({"type": "number", "multipleOf": 0.5}, "test")  # ... so the server refuses it


def test_the_grammar_starts_after_the_thinking(grammar, comp, tok):
    compiled = comp.compile_json_schema(json.dumps({"type": "object"}), any_whitespace=False, strict_mode=False)
    ids = tok.convert_tokens_to_ids
    constraint = grammar.Constraint(compiled, tok, len(tok), "pre")

    class Spec:
        tokens: list = []

    def allowed(tokens) -> set:
        Spec.tokens = tokens
        scores = constraint(Spec, torch.zeros(len(tok)))
        return set(torch.nonzero(torch.isfinite(scores)).flatten().tolist())

    newline = tok.encode("\n", add_special_tokens=False)[0]
    body = grammar.Constraint(compiled, tok, len(tok), "body")  # the grammar alone
    opening = set(torch.nonzero(torch.isfinite(body(Spec, torch.zeros(len(tok))))).flatten().tolist())
    assert ids("{") in opening and all(tok.decode([t]).startswith("{") for t in opening)
    assert allowed([]) == opening | {ids("<think>"), newline}  # the reply may open its thinking
    assert allowed([newline]) == opening | {ids("<think>")}
    assert len(allowed([newline, ids("<think>")])) == len(tok)  # thinking is free
    assert len(allowed([newline, ids("<think>"), 100, 200])) == len(tok)
    thought = [newline, ids("<think>"), 100, 200, ids("</think>")]  # the mask reads tokens as they come
    assert allowed(thought) == opening | {newline}  # then one optional newline, then the grammar
    assert allowed(thought + [newline]) == opening


def test_after_the_grammar_took_its_stop_token_only_a_stop_token_is_allowed(grammar, comp, tok):
    """With async batching a finished row can be in one more step: its mask must not ask xgrammar for
    a next token (which raised on the H200, W21) and must leave only a stop token to choose."""
    compiled = comp.compile_json_schema(json.dumps({"type": "integer"}), any_whitespace=False, strict_mode=False)
    constraint = grammar.Constraint(compiled, tok, len(tok), "body")
    end = tok.convert_tokens_to_ids("<|endoftext|>")

    class Spec:
        tokens = tok.encode("7", add_special_tokens=False) + [end]

    scores = constraint(Spec, torch.zeros(len(tok)))
    assert constraint.matcher.is_terminated()
    assert torch.nonzero(torch.isfinite(scores)).flatten().tolist() == [end]
    Spec.tokens = Spec.tokens + [end]  # the dropped extra token is read without a complaint
    assert torch.nonzero(torch.isfinite(constraint(Spec, torch.zeros(len(tok))))).flatten().tolist() == [end]


WEATHER_TOOL = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("body,taken,compiles", [
    ({}, {}, False),
    ({"response_format": None}, {"n": 2, "reasoning_effort": "low"}, False),
    ({"response_format": {"type": "text"}}, {}, True),  # a field it reads: the thread decides
    ({"response_format": {"type": "json_object"}}, {}, True),
    ({}, {"structured_outputs": {"choice": ["a", "b"]}}, True),
    ({}, {"guided_regex": "a+"}, True),
])
def test_a_request_without_structured_output_fields_asks_no_grammar(grammar, body, taken, compiles):
    # 0530: such a request's constraint_for runs inline, not on the prep thread
    assert grammar.asks_constraint(body, taken) is compiles


@pytest.mark.parametrize("body,compiles", [
    ({}, False),
    ({"tools": []}, False),
    ({"tools": [WEATHER_TOOL]}, False),  # auto, parallel: what agents send; nothing to enforce
    ({"tools": [WEATHER_TOOL], "tool_choice": "none"}, False),  # the call tokens forbidden, no grammar
    ({"tools": [WEATHER_TOOL], "tool_choice": "required"}, True),
    ({"tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "weather"}}}, True),
    ({"tools": [WEATHER_TOOL], "parallel_tool_calls": False}, True),
    ({"tools": [{"type": "function", "function": {**WEATHER_TOOL["function"], "strict": True}}]}, True),
    ({"tools": ["weather"]}, True),  # malformed: tool_constraint names what is wrong, on the thread
])
def test_only_tools_that_need_enforcing_ask_a_tool_grammar(grammar, body, compiles):
    assert grammar.asks_tool_grammar(body) is compiles

"""The GLM reply parser and schema typing of the patched engine (0080), driven directly.

The modules are loaded from the built engine's `transformers/_pb/` as a package of their
own: they import nothing else of transformers, so no model or server is needed. Each case
runs twice: the whole reply at once, and fed one character at a time as a stream would.
"""

import json

import pytest

from .conftest import engine_module

pytestmark = pytest.mark.engine

WEATHER = {"type": "function", "function": {"name": "weather", "parameters": {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "code": {"type": "string"},
        "ratio": {"type": "number"},
        "maybe": {"type": ["integer", "null"]},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "flag": {"type": "boolean"},
        "unit": {"enum": ["c", "f"]},
        "level": {"oneOf": [{"type": "integer"}, {"type": "string"}]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "where": {"$ref": "#/$defs/place"},
    },
    "$defs": {"place": {"type": "object"}},
}}}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def glm(patched_engine):
    return engine_module(patched_engine, "api.glm_parser")


def both_ways(glm, text, truncated=False, in_reasoning=False):
    """Parse whole and streamed; they must agree (stray </think> aside, see its test)."""
    whole = glm.parse(text, TOOLS, in_reasoning=in_reasoning, truncated=truncated)
    parser = glm.GlmParser(TOOLS, in_reasoning=in_reasoning)
    events = []
    for ch in text:
        events += parser.feed(ch)
    events += parser.finish(truncated)
    streamed = glm.collect(events)
    assert streamed == whole
    # The streamed argument pieces of each completed call join to its JSON arguments.
    for index, args in [(e[1], e[2]) for e in events if e[0] == "end"]:
        pieces = "".join(e[2] for e in events if e[0] == "args" and e[1] == index)
        assert json.loads(pieces) == args
    return whole, events


def call(name, *pairs, newlines=True):
    nl = "\n" if newlines else ""
    body = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in pairs)
    return f"<tool_call>{name}{nl}{body}</tool_call>"


@pytest.mark.parametrize("newlines", [True, False], ids=["glm45", "glm47-compact"])
def test_reasoning_content_and_a_typed_call(glm, newlines):
    text = ("\n<think>Need the weather.</think>\nLooking it up.\n"
            + call("weather", ("city", "  Beijing  "), ("days", "3"), ("code", "0042"), ("ratio", "0.5"),
                   ("flag", "true"), ("unit", "c"), ("tags", '["a", "b"]'), newlines=newlines)
            + "<|observation|>")
    whole, _ = both_ways(glm, text)
    assert whole["reasoning"] == "Need the weather."
    assert whole["content"] == "Looking it up."
    assert whole["calls"] == [("weather", {"city": "  Beijing  ", "days": 3, "code": "0042", "ratio": 0.5,
                                           "flag": True, "unit": "c", "tags": ["a", "b"]})]


@pytest.mark.parametrize("key,raw,value", [
    ("code", "123_456", "123_456"),       # a string parameter is never converted
    ("code", "null", "null"),             # ... not even "null"
    ("city", "42", "42"),
    ("maybe", "null", None),              # null where the schema allows it
    ("maybe", "7", 7),
    ("note", "null", None),               # anyOf [string, null]
    ("note", "0042", "0042"),
    ("level", "5", 5),                    # oneOf [integer, string]
    ("level", "high", "high"),
    ("days", "5.0", 5.0),
    ("flag", "False", False),             # Python's spelling
    ("where", '{"x": 1}', {"x": 1}),      # $ref to an object
    ("undeclared", "17", "17"),           # not in the schema: kept as written
])
def test_values_are_typed_by_the_schema(glm, key, raw, value):
    whole, _ = both_ways(glm, call("weather", (key, raw)))
    assert whole["calls"] == [("weather", {key: value})]
    assert type(whole["calls"][0][1][key]) is type(value)


def test_close_tag_inside_a_value_is_text(glm):
    whole, _ = both_ways(glm, call("weather", ("city", "a</tool_call>b")))
    assert whole["calls"] == [("weather", {"city": "a</tool_call>b"})]


def test_missing_final_arg_value_close(glm):
    text = "<tool_call>weather<arg_key>city</arg_key><arg_value>Oslo</tool_call>"
    whole, _ = both_ways(glm, text)
    assert whole["calls"] == [("weather", {"city": "Oslo"})]
    # ... also when another call follows directly.
    whole, _ = both_ways(glm, text + call("now"))
    assert whole["calls"] == [("weather", {"city": "Oslo"}), ("now", {})]


def test_parallel_calls_to_the_same_tool_and_text_after(glm):
    text = call("weather", ("city", "a")) + "\n" + call("weather", ("city", "b")) + "\nBoth asked."
    whole, events = both_ways(glm, text)
    assert whole["calls"] == [("weather", {"city": "a"}), ("weather", {"city": "b"})]
    assert whole["content"] == "Both asked."
    assert [e[1] for e in events if e[0] == "call"] == [0, 1]


def test_close_think_without_open(glm):
    whole = glm.parse("The prompt opened thinking.</think>Answer.", TOOLS)
    assert whole == {"reasoning": "The prompt opened thinking.", "content": "Answer.", "calls": []}
    # When the prompt itself ends in <think>, streaming knows from the start.
    whole, _ = both_ways(glm, "Thinking.</think>Answer.", in_reasoning=True)
    assert whole["reasoning"] == "Thinking." and whole["content"] == "Answer."


def test_a_call_cut_by_max_tokens_is_not_a_call(glm):
    for cut in ("<tool_call>weath", "<tool_call>weather\n<arg_key>ci",
                "<tool_call>weather\n<arg_key>city</arg_key>\n<arg_value>Par"):
        whole, events = both_ways(glm, "Sure." + cut, truncated=True)
        assert whole["calls"] == [] and whole["content"] == "Sure."
        assert not [e for e in events if e[0] == "end"]


@pytest.mark.parametrize("text", [
    "<think>a</think>b" + call("now") + "<|user|>",
    "x</arg_key><arg_value>y</tool_call>z",
    "<think>r</think></think>c<|endoftext|>",
])
def test_no_markup_reaches_content_or_reasoning(glm, text):
    whole, _ = both_ways(glm, text)
    for field in (whole["content"], whole["reasoning"]):
        assert not any(tag in field for tag in ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                                                  "<tool_call>", "</tool_call>", "<think>", "</think>", "<|"))


def test_partial_tags_are_held_until_known(glm):
    parser = glm.GlmParser(TOOLS)
    assert parser.feed("Hello <tool") == [("content", "Hello ")]
    assert parser.feed("box>") == [("content", "<toolbox>")]  # not a tag after all

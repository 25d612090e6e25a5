"""The GLM reply parser and schema typing of the patched engine (0080), driven directly.

The modules are loaded from the built engine's `transformers/_pb/` as a package of their
own: they import nothing else of transformers, so no model or server is needed. Each case
runs whole and as a stream: one character at a time, split in two at every point, and in
random pieces; every way gives the same result.
"""

import json
import random

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


def chunkings(text):
    """Ways a stream can cut `text`: per character, in two at every point, in random pieces."""
    yield list(text)
    for i in range(1, len(text)):
        yield [text[:i], text[i:]]
    rng = random.Random(text)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12)))) if len(text) > 1 else []
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def both_ways(glm, text, truncated=False, in_reasoning=False, **kw):
    """Parse whole and streamed; they must agree (stray </think> aside, see its test)."""
    whole = glm.parse(text, TOOLS, in_reasoning=in_reasoning, truncated=truncated, **kw)
    for pieces in chunkings(text):
        parser = glm.GlmParser(TOOLS, in_reasoning=in_reasoning, **kw)
        events = []
        for piece in pieces:
            events += parser.feed(piece)
        events += parser.finish(truncated)
        assert glm.collect(events) == whole, pieces
        # The streamed argument pieces of each completed call join to its JSON arguments.
        for index, args in [(e[1], e[2]) for e in events if e[0] == "end"]:
            streamed = "".join(e[2] for e in events if e[0] == "args" and e[1] == index)
            assert streamed == json.dumps(args, ensure_ascii=False), pieces
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


# ---- what the models' templates write ------------------------------------------------------
# An assistant turn as GLM-4.5's chat template renders it (a newline before each part of a
# call) and as GLM-4.7's does (none): a string value as it is, any other as JSON, nothing
# around either. Parsing a rendering gives back the message, whatever markup its values hold.


def render(style, reasoning=None, content="", calls=()):
    nl = "\n" if style == "glm45" else ""
    out = f"{nl}<think>{reasoning}</think>" if reasoning is not None else ""
    out += nl + content if content else ""
    for name, args in calls:
        out += f"{nl}<tool_call>{name}{nl}"
        for k, v in args.items():
            v = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            out += f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}"
        out += "</tool_call>"
    return out


MESSAGES = {
    "arg-key-in-a-value": ("Look it up.", "", [("weather", {"city": "a<arg_key>b</arg_key>c", "days": 2})]),
    "arg-key-ends-a-value": (None, "", [("weather", {"city": "Oslo<arg_key>", "days": 3, "code": "0042"})]),
    "end-value-in-a-value": (None, "", [("weather", {"city": "x</arg_value>y", "code": "</arg_value>"})]),
    "end-value-then-space": (None, "", [("weather", {"city": "x</arg_value> <arg_value>y",
                                                     "code": "z</arg_value>\n"})]),
    "every-tag-in-a-value": (None, "", [("weather", {"city": "<tool_call>f</tool_call><think>t</think>"
                                                            "<arg_value>v</arg_key>x"})]),
    "markup-in-json-values": (None, "", [("weather", {"where": {"html": "<arg_key>k</arg_key><arg_value>v</arg_value>"},
                                                      "tags": ["</arg_value>", "<arg_key>"], "days": 7})]),
    "whitespace-of-values": (None, "", [("weather", {"city": "  Beijing  ", "note": "\nline\n", "code": " ",
                                                     "unit": "\t"})]),
    "empty-value": (None, "", [("weather", {"city": "", "days": 1})]),
    "typed-values": ("Numbers.", "", [("weather", {"days": 7, "ratio": 0.25, "flag": False, "maybe": None,
                                                   "level": 2, "undeclared": "{\"a\": 1}"})]),
    "several-calls": ("Two cities.", "Checking both.", [
        ("weather", {"city": "a"}), ("now", {}), ("weather", {"city": "b</tool_call>c", "days": 1}),
        ("weather", {"city": "<tool_call>d"})]),
    "no-call": ("Just say hi.", "Hi there.", []),
}


@pytest.mark.parametrize("style", ["glm45", "glm47"])
@pytest.mark.parametrize("case", MESSAGES, ids=str)
def test_a_rendered_message_parses_back(glm, case, style):
    reasoning, content, calls = MESSAGES[case]
    text = render(style, reasoning, content, calls)
    whole, _ = both_ways(glm, text)
    assert whole == {"reasoning": reasoning or "", "content": content, "calls": calls}


# Replies no template renders, as models write them: (text, what it parses to, parser settings).
OSLO = ("weather", {"city": "Oslo"})
REPLIES = {
    # A call ends thinking the model never closed; the newline before it is the template's.
    "unclosed-thinking-glm45": ("\n<think>Need the weather.\n<tool_call>weather\n<arg_key>city</arg_key>\n"
                                "<arg_value>Oslo</arg_value>\n</tool_call>", ("Need the weather.", "", [OSLO]), {}),
    "unclosed-thinking-glm47": ("<think>Need the weather.<tool_call>weather<arg_key>city</arg_key>"
                                "<arg_value>Oslo</arg_value></tool_call>", ("Need the weather.", "", [OSLO]), {}),
    "prompt-opened-thinking": ("Need it.\n\n<tool_call>now\n</tool_call>\n<tool_call>weather\n"
                               "<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n</tool_call>",
                               ("Need it.\n", "", [("now", {}), OSLO]), {"in_reasoning": True}),
    # A tool grammar's one whitespace character just inside each side of a value is padding.
    "grammar-padding": ("<tool_call>weather<arg_key>city</arg_key><arg_value> Oslo\n</arg_value>\n"
                        "<arg_key>unit</arg_key><arg_value>c </arg_value><arg_key>code</arg_key>"
                        "<arg_value>  a  </arg_value><arg_key>note</arg_key><arg_value> </arg_value>"
                        "<arg_key>days</arg_key><arg_value> 3\n</arg_value></tool_call>",
                        (None, "", [("weather", {"city": "Oslo", "unit": "c", "code": " a ", "note": "",
                                                 "days": 3})]), {"padded": True}),
    "no-grammar-no-padding": ("<tool_call>weather<arg_key>city</arg_key><arg_value> Oslo\n</arg_value>"
                              "<arg_key>unit</arg_key><arg_value>c </arg_value></tool_call>",
                              (None, "", [("weather", {"city": " Oslo\n", "unit": "c "})]), {}),
    "padded-value-with-markup": ("<tool_call>weather<arg_key>city</arg_key><arg_value>\na</arg_value> b\n"
                                 "</arg_value>\n</tool_call>",
                                 (None, "", [("weather", {"city": "a</arg_value> b"})]), {"padded": True}),
    # The reply's end (or an end-of-turn token) is as good as the call's next part.
    "end-value-at-the-end": ("<tool_call>weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>\n",
                             (None, "", [OSLO]), {}),
    "end-value-at-an-end-token": ("<tool_call>weather<arg_key>city</arg_key><arg_value>Oslo</arg_value>"
                                  "<|observation|>", (None, "", [OSLO]), {}),
    "missing-end-value-at-an-end-token": ("<tool_call>weather<arg_key>city</arg_key><arg_value>Oslo</tool_call>"
                                          "\n<|observation|>", (None, "", [OSLO]), {}),
    "end-value-then-text": ("<tool_call>weather<arg_key>city</arg_key><arg_value>a</arg_value>\n b</arg_value>"
                            "</tool_call>", (None, "", [("weather", {"city": "a</arg_value>\n b"})]), {}),
}


@pytest.mark.parametrize("case", REPLIES, ids=str)
def test_replies_as_models_write_them(glm, case):
    text, (reasoning, content, calls), settings = REPLIES[case]
    whole, _ = both_ways(glm, text, **settings)
    assert whole == {"reasoning": reasoning or "", "content": content, "calls": calls}


def test_a_value_streams_up_to_the_tag_that_decides(glm):
    parser = glm.GlmParser(TOOLS)

    def streamed(piece):
        return "".join(e[2] for e in parser.feed(piece) if e[0] == "args")

    assert streamed("<tool_call>weather<arg_key>city</arg_key><arg_value>a<arg_key>b") == '{"city": "a<arg_key>b'
    assert streamed("</arg_value>") == ""  # the value's end, or text of it
    assert streamed("\n<arg") == ""  # ... still either
    assert streamed("_value>c") == "</arg_value>\\n<arg_value>c"  # text
    assert streamed("</arg_value><arg_key>days</arg_key><arg_value>4</arg_value>") == '", "days": '
    assert streamed("</tool_call>") == "4}"  # a typed value goes out once it is known to end
    padded = glm.GlmParser(TOOLS, padded=True)
    events = padded.feed("<tool_call>weather<arg_key>city</arg_key><arg_value> Oslo ")
    assert "".join(e[2] for e in events if e[0] == "args") == '{"city": "Oslo'  # the pad may end it
    events = padded.feed("now</arg_value>")
    assert "".join(e[2] for e in events if e[0] == "args") == " now"


def test_partial_tail_is_the_longest_tag_start_at_the_end(patched_engine):
    """The held-back tail (what could still become a tag) is, for every tag set the parser uses,
    the longest n such that the text's last n characters start some tag and are not all of it."""
    gp = engine_module(patched_engine, "api.glm_parser")
    rnd = random.Random(5)
    sets = [gp.TAGS, gp.AFTER_VALUE, gp.AFTER_OPEN_VALUE, (gp.END_VALUE, gp.END_CALL, *gp.ENDS)]
    pieces = [t[:n] for t in gp.TAGS for n in range(len(t) + 1)] + ["x", " ", "\n", "<", "|", "a<"]
    for _ in range(3000):
        tags = rnd.choice(sets)
        buf = "".join(rnd.choice(pieces) for _ in range(rnd.randrange(1, 4)))
        expected = max([n for t in tags for n in range(1, min(len(t), len(buf) + 1)) if buf.endswith(t[:n])],
                       default=0)
        assert gp._partial_tail(buf, tags) == expected, (buf, tags)

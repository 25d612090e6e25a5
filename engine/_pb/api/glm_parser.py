"""Incremental parser for GLM-4.5 / 4.7 replies: thinking, content and tool calls.

    <think>reasoning</think>
    content
    <tool_call>name
    <arg_key>k</arg_key>
    <arg_value>v</arg_value>
    </tool_call>

GLM-4.7 writes the same without newlines. Text arrives in pieces (one decoded token at a
time); a piece that could be the start of a tag is held back until the next piece says
whether it is one. `feed` and `finish` return events:

    ("reasoning", text) ("content", text)
    ("call", index, name)            a call opened: its name is known
    ("args", index, json_text)       the next piece of the call's JSON arguments
    ("end", index, arguments_dict)   the call is complete

The arguments of a call stream as JSON text whose pieces join to the `json.dumps` of the
final dict; string arguments stream as they are written, typed ones when complete. No
markup ever reaches content or reasoning.

Inside an argument value every tag is text (a value may hold any GLM markup) save two,
and those only where the call's own structure can go on after them (whitespace aside):
- `</arg_value>` ends the value before `<arg_key>`, `</tool_call>` or the end of the reply
  (the parts the template writes next);
- `</tool_call>` ends the value and the call before another `<tool_call>` or the end of
  the reply: the model left out `</arg_value>`.
Until what follows the tag decides, the value streams up to the tag and no further.

The template writes a value exactly, with nothing around it, so a string value is kept as
written. Where a tool grammar shaped the reply (`padded`), xgrammar's GLM structure admits
one whitespace character just inside each side of a value as padding: that one is not part
of the value (or a grammar's enum or maxLength would not hold for what the client gets),
so the last whitespace character of a string value streams only once the value goes on.

Edge cases, by rule:
- A call opened inside thinking that was never closed ends the thinking there; the newline
  the template writes before `<tool_call>` is not reasoning, as it is not content.
- `</think>` with no `<think>` (the prompt opened the thinking, or the model skipped the
  tag): text before it that is still held is reasoning (all of it, when not streaming).
- A call still open when the reply is cut by max_tokens is dropped (`truncated`); one open
  at a natural end with its values closed is completed.
"""

import json

from . import schema_types

THINK, END_THINK = "<think>", "</think>"
CALL, END_CALL = "<tool_call>", "</tool_call>"
KEY, END_KEY = "<arg_key>", "</arg_key>"
VALUE, END_VALUE = "<arg_value>", "</arg_value>"
# End-of-turn tokens that decode as text when special tokens are kept.
ENDS = ("<|user|>", "<|observation|>", "<|endoftext|>", "<|assistant|>", "<|system|>")
TAGS = (THINK, END_THINK, CALL, END_CALL, KEY, END_KEY, VALUE, END_VALUE, *ENDS)
# What the call's own structure can write next, after whitespace: after `</arg_value>`, and
# after a `</tool_call>` that closes a value left without `</arg_value>`.
AFTER_VALUE = (KEY, END_CALL, *ENDS)
AFTER_OPEN_VALUE = (CALL, *ENDS)
PAD = " \n\r\t"  # xgrammar's whitespace


class _Call:
    def __init__(self, index: int):
        self.index = index
        self.name = ""
        self.args: dict = {}
        self.key = ""
        self.value = ""  # the current value's raw text
        self.shown = 0  # how much of a text value's final text has streamed
        self.text_value = False  # the current value streams as a JSON string
        self.opened = False  # the ("call", …) event went out
        self.sent_args = False


class GlmParser:
    def __init__(self, tools: list | None = None, in_reasoning: bool = False, padded: bool = False):
        self.padded = padded
        self.tools = {}
        for tool in tools or []:
            fn = tool.get("function", tool) if isinstance(tool, dict) else {}
            if isinstance(fn, dict) and isinstance(fn.get("name"), str):
                self.tools[fn["name"]] = fn.get("parameters") or {}
        self.mode = "reasoning" if in_reasoning else "content"
        self.buf = ""
        self.calls: list[_Call] = []
        self.done_calls: list[tuple[str, dict]] = []
        self.call: _Call | None = None
        self.saw_think = in_reasoning
        self.content_started = False  # a leading newline of a content run is dropped
        self.held_newline = False  # a content newline that may precede <tool_call>
        self.held_thought_newline = False  # the same in thinking a call ends unclosed
        self.events: list = []

    # ---- public -------------------------------------------------------------------------

    def feed(self, text: str) -> list:
        self.buf += text
        self._run(final=False)
        return self._take()

    def finish(self, truncated: bool) -> list:
        self._run(final=True)
        self._release_thought_newline()
        call = self.call
        if call is not None:
            if truncated or self.mode in ("key", "key_done") or not call.name.strip():
                self.call = None  # cut mid-call: nothing half-parsed becomes a call
            else:
                if self.mode == "name":
                    self._open_call()
                if self.mode == "value":
                    self._close_value()
                self._close_call()
        self.mode = "content"
        return self._take()

    # ---- machinery ----------------------------------------------------------------------

    def _take(self) -> list:
        out, self.events = self.events, []
        return out

    def _emit_text(self, kind: str, text: str) -> None:
        if not text:
            return
        if kind == "content":
            if not self.content_started:
                if text.startswith("\n"):
                    text = text[1:]
                self.content_started = bool(text)
                if not text:
                    return
            if self.held_newline:
                text, self.held_newline = "\n" + text, False
            if text.endswith("\n"):
                text, self.held_newline = text[:-1], True
            if not text:
                return
        if kind == "reasoning":
            if self.held_thought_newline:
                text, self.held_thought_newline = "\n" + text, False
            if text.endswith("\n"):
                text, self.held_thought_newline = text[:-1], True
            if not text:
                return
        self._append(kind, text)

    def _append(self, kind: str, text: str) -> None:
        if self.events and self.events[-1][0] == kind:
            self.events[-1] = (kind, self.events[-1][1] + text)
        else:
            self.events.append((kind, text))

    def _run(self, final: bool) -> None:
        while self.buf:
            tags = self._tags_for_mode()
            pos, tag = _find_first(self.buf, tags)
            if tag is None:
                keep = 0 if final else _partial_tail(self.buf, tags)
                self._text(self.buf[: len(self.buf) - keep])
                self.buf = self.buf[len(self.buf) - keep:]
                return
            if self.mode == "value" and tag in (END_VALUE, END_CALL):
                after = self.buf[pos + len(tag):]
                ends = _ends_value(after, AFTER_VALUE if tag == END_VALUE else AFTER_OPEN_VALUE, final)
                if ends is None:  # not known yet: the value streams up to the tag
                    self._text(self.buf[:pos])
                    self.buf = self.buf[pos:]
                    return
                if not ends:  # literal text of the value
                    self._text(self.buf[: pos + len(tag)])
                    self.buf = after
                    continue
            self._text(self.buf[:pos])
            self.buf = self.buf[pos + len(tag):]
            self._tag(tag)

    def _tags_for_mode(self) -> tuple:
        if self.mode == "value":
            return (END_VALUE, END_CALL, *ENDS)
        if self.mode == "key":
            return (END_KEY, END_CALL, *ENDS)
        return TAGS

    def _text(self, text: str) -> None:
        if not text:
            return
        mode, call = self.mode, self.call
        if mode == "content":
            self._emit_text("content", text)
        elif mode == "reasoning":
            self._emit_text("reasoning", text)
        elif mode == "name":
            if "\n" in text:
                head, _, rest = text.partition("\n")
                call.name += head
                self._open_call()
                self.mode = "body"
                self._text(rest)
            else:
                call.name += text
        elif mode == "key":
            call.key += text
        elif mode == "value":
            call.value += text
            if call.text_value:
                self._stream_value()
        # text between the parts of a call (newlines, stray words) is not part of any field

    def _release_thought_newline(self) -> None:
        if self.held_thought_newline:
            self.held_thought_newline = False
            self._append("reasoning", "\n")

    def _tag(self, tag: str) -> None:
        mode = self.mode
        if tag == CALL:
            self.held_thought_newline = False  # the template's newline before <tool_call>
        self._release_thought_newline()
        if tag in ENDS:
            return
        if tag == THINK:
            if mode in ("content", "reasoning"):
                self.mode, self.saw_think = "reasoning", True
            return
        if tag == END_THINK:
            if mode == "content" and not self.saw_think:
                # A close with no open: whatever content is still held was thinking.
                self._reclassify_held_content()
            if mode in ("content", "reasoning"):
                self.mode, self.content_started, self.held_newline = "content", False, False
            return
        if tag == CALL:
            if mode in ("body", "key_done", "name"):
                self._close_call()
            self.call = _Call(len(self.calls) + len(self.done_calls))
            self.calls.append(self.call)
            self.mode, self.held_newline = "name", False
            return
        if self.call is None:
            return  # a call tag outside a call is dropped
        if tag == END_CALL:
            if mode == "value":
                self._close_value()
            self._close_call()
            self.mode, self.content_started = "content", False
        elif tag == KEY:
            if mode == "name":
                self._open_call()
            self.call.key, self.mode = "", "key"
        elif tag == END_KEY and mode == "key":
            self.mode = "key_done"
        elif tag == VALUE and mode in ("key_done", "body"):
            self._start_value()
        elif tag == END_VALUE and mode == "value":
            self._close_value()
            self.mode = "body"

    def _open_call(self) -> None:
        call = self.call
        if call.opened:
            return
        call.name = call.name.strip()
        call.opened = True
        self.events.append(("call", call.index, call.name))

    def _args(self, text: str) -> None:
        if text:
            self.events.append(("args", self.call.index, text))

    def _value_text(self) -> str:
        """The current value without the grammar's padding (a pad still at the end is held)."""
        text = self.call.value
        if self.padded:
            text = text[1:] if text[:1] and text[0] in PAD else text
            text = text[:-1] if text and text[-1] in PAD else text
        return text

    def _stream_value(self) -> None:
        call = self.call
        text = self._value_text()
        self._args(json.dumps(text[call.shown:], ensure_ascii=False)[1:-1])
        call.shown = len(text)

    def _start_value(self) -> None:
        call = self.call
        key = call.key.strip()
        schema, root = schema_types.param_schema(self.tools.get(call.name), key)
        call.key, call.value, call.shown = key, "", 0
        call.text_value = schema_types.is_text(schema, root)
        self._args(("{" if not call.sent_args else ", ") + json.dumps(key, ensure_ascii=False) + ": ")
        call.sent_args = True
        if call.text_value:
            self._args('"')
        self.mode = "value"

    def _close_value(self) -> None:
        call = self.call
        schema, root = schema_types.param_schema(self.tools.get(call.name), call.key)
        value = schema_types.convert(self._value_text(), schema, root)
        call.args[call.key] = value
        if call.text_value:
            self._stream_value()
            self._args('"')
        else:
            self._args(json.dumps(value, ensure_ascii=False))
        self.mode = "body"

    def _close_call(self) -> None:
        call = self.call
        if not call.opened:
            self._open_call()
        self._args("}" if call.sent_args else "{}")
        self.events.append(("end", call.index, dict(call.args)))
        self.calls.remove(call)
        self.done_calls.append((call.name, dict(call.args)))
        self.call = None
        self.mode = "content"

    def _reclassify_held_content(self) -> None:
        for i, event in enumerate(self.events):
            if event[0] == "content":
                self.events[i] = ("reasoning", event[1])
        self.held_newline = False


def _ends_value(after: str, nexts: tuple, final: bool) -> bool | None:
    """Whether a closing tag in a value is structure, from the text `after` it: the call's
    own next part follows (True), something else does (False), or not known yet (None)."""
    rest = after.lstrip()
    if not rest:
        return True if final else None
    if rest.startswith(nexts):
        return True
    if not final and any(tag.startswith(rest) for tag in nexts):
        return None
    return False


def _find_first(buf: str, tags) -> tuple[int, str | None]:
    best, found = len(buf) + 1, None
    for tag in tags:
        i = buf.find(tag)
        if i != -1 and (i < best or i == best and len(tag) > len(found)):
            best, found = i, tag
    return (best, found) if found else (-1, None)


_PREFIXES: dict = {}  # tags -> (every proper prefix of a tag, the longest one's length)


def _partial_tail(buf: str, tags) -> int:
    """How many trailing characters could be the start of one of `tags`: the longest n for which
    buf's last n characters are a proper prefix of a tag (called for every piece of text, so the
    prefixes are worked out once per tag set)."""
    known = _PREFIXES.get(tags)
    if known is None:
        prefixes = {tag[:n] for tag in tags for n in range(1, len(tag))}
        known = _PREFIXES[tags] = (prefixes, max(map(len, prefixes), default=0))
    prefixes, longest = known
    for n in range(min(longest, len(buf)), 0, -1):
        if buf[-n:] in prefixes:
            return n
    return 0


def parse(text: str, tools=None, in_reasoning: bool = False, truncated: bool = False, padded: bool = False) -> dict:
    """A whole reply at once: {"content", "reasoning", "calls": [(name, args)]}."""
    parser = GlmParser(tools, in_reasoning=in_reasoning, padded=padded)
    events = parser.feed(text) + parser.finish(truncated)
    return collect(events)


def collect(events) -> dict:
    content = "".join(e[1] for e in events if e[0] == "content")
    reasoning = "".join(e[1] for e in events if e[0] == "reasoning")
    names = {e[1]: e[2] for e in events if e[0] == "call"}
    calls = [(names.get(e[1], ""), e[2]) for e in events if e[0] == "end"]
    return {"content": content, "reasoning": reasoning, "calls": calls}

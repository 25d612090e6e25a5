"""One chat reply as it is generated: its tokens in, GLM parser events out, and its OpenAI
shapes (deltas for a stream, the whole message, usage, finish reason). chat.py submits the
request and answers it; each choice of a request has a Reply of its own."""

import hashlib
import json
import weakref
from typing import NamedTuple

from .. import knobs
from . import glm_parser, usage, vllm_fields
from . import stops as stops_
from ..runtime import batched_sampler


GLM_TYPES = ("glm4_moe", "glm4", "glm4_moe_lite")

# tokenizer -> {token id: _Token}: a logprobs reply names six tokens a step (top_logprobs 5), and
# decoding and serializing each anew held the event loop for most of a reply's host work.
_TOKENS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


class _Token(NamedTuple):
    """One token's logprobs entry, worked out once per tokenizer: its text, its UTF-8 bytes (a list:
    the JSON shape; callers must not change it), and the entry's JSON on either side of its
    number: `{"token":…,"logprob":` and `,"bytes":[…]`."""

    text: str
    utf8: list
    head: str
    tail: str


def token_text(tokenizer, token: int) -> _Token:
    """One token id alone as text and bytes (see _Token), decoded once per tokenizer."""
    known = _TOKENS.get(tokenizer)
    if known is None:
        known = _TOKENS.setdefault(tokenizer, {})
    entry = known.get(token)
    if entry is None:
        text = _decode_one(tokenizer, token)
        utf8 = list(text.encode("utf-8"))
        entry = known[token] = _Token(text, utf8, '{"token":' + dumps(text) + ',"logprob":',
                                      ',"bytes":[' + ",".join(map(str, utf8)) + "]")
    return entry


def warm(tokenizer) -> None:
    """Work out every token id's entry now (0720's reply process does, on a thread of its own, when
    it gets a tokenizer): a random model's top five are mostly ids not seen before, and each first
    sight cost about 9 us of a reply's time."""
    for token in range(len(tokenizer)):
        token_text(tokenizer, token)


def _decode_one(tokenizer, token: int) -> str:
    """tokenizer.decode([token]), straight from the Rust tokenizer where the wrapper would only
    pass it through (no clean-up of spaces): a random model's top five are mostly ids not seen
    before, and the wrapper's call was most of a new id's cost."""
    rust = getattr(tokenizer, "_tokenizer", None)
    if rust is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return tokenizer.decode([token])
    return rust.decode([token], skip_special_tokens=False)


# Characters JSON leaves raw that line readers following str.splitlines (httpx's iter_lines, for
# one) take for line ends: raw, they cut an SSE data line in two for those clients. They can only
# stand inside JSON strings, where their escapes mean the same text.
_LINE_ENDS = (("\x85", "\\u0085"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))


def dumps(value) -> str:
    """JSON as a streamed chunk writes it: compact, non-ASCII as it is except the three
    characters a line reader could split on (_LINE_ENDS), which are escaped."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    if not text.isascii():
        for raw, escaped in _LINE_ENDS:
            if raw in text:
                text = text.replace(raw, escaped)
    return text


_WORDS = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}  # what json.dumps writes for these


def json_number(value: float) -> str:
    """A number as json.dumps writes it as a float."""
    text = repr(float(value))
    return _WORDS.get(text, text)


def _entry(token: _Token, logprob: float) -> dict:
    return {"token": token.text, "logprob": logprob, "bytes": token.utf8}


PROMPT_TAIL = 8  # the prompt's last ids a reply reads: does the prompt open a thinking block?


def parses(model) -> bool:
    return bool(knobs.get("PB_GLM_PARSER")) and getattr(model.config, "model_type", None) in GLM_TYPES


class Reply:
    """One request's generation: tokens in, parser events out."""

    def __init__(self, request_id: str, tokenizer, input_ids: list[int], tools, model, max_new_tokens,
                 spec=None, stops=(), eos=None, padded=False, parse: bool | None = None, prompt_len: int | None = None):
        """`parse`: whether the GLM parser reads the reply (by default: `parses(model)`). Only the
        prompt's last PROMPT_TAIL ids are read: `input_ids` may be those, with `prompt_len` the
        prompt's length."""
        from tokenizers.decoders import DecodeStream

        self.request_id = request_id
        self.tokenizer = tokenizer
        self.rust = tokenizer._tokenizer
        self.prompt_len = len(input_ids) if prompt_len is None else prompt_len
        self.max_new_tokens = max_new_tokens
        self.decoder = DecodeStream([], skip_special_tokens=False)
        prompt_tail = tokenizer.decode(input_ids[-PROMPT_TAIL:]) if input_ids else ""
        opens_thinking = prompt_tail.rstrip().endswith(glm_parser.THINK)
        self.tools, self.opens_thinking, self.padded = tools, opens_thinking, padded
        self.parser = (glm_parser.GlmParser(tools, in_reasoning=opens_thinking, padded=padded)
                       if (parses(model) if parse is None else parse) else None)
        self.spec, self.stops = spec, tuple(stops)
        self.cutter = stops_.StopCutter(self.stops, bool(vllm_fields.get("include_stop_str_in_output")))
        # End-of-turn tokens end the reply; they are never text of it, whatever they decode to.
        self.eos = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        self.tokens: list[int] = []
        self.text = ""  # what the parser was given
        self.error: str | None = None
        self.finished = False
        self.call_ids: dict[int, str] = {}
        self.calls_ended = 0
        # per token with logprobs: (its _Token, its logprob, [(_Token, logprob) of the top ones])
        self.logprob_rows: list[tuple] = []
        self.logprobs_sent = 0  # how many of them a stream has carried
        self.reasoning_tokens = 0
        usage.watch(request_id)

    # -- tokens in ----------------------------------------------------------------------

    def take(self, output) -> list:
        """New tokens of a GenerationOutput -> parser events (or raw text events)."""
        events = []
        for token in output.generated_tokens[len(self.tokens):]:
            if self.stopped:
                break
            self.tokens.append(int(token))
            self._record_logprob(len(self.tokens) - 1)
            if int(token) in self.eos:
                continue
            piece = self.decoder.step(self.rust, int(token))
            if piece:
                events += self._feed(piece)
            if self.parser is not None and (self.parser.mode == "reasoning" or glm_parser.END_THINK in (piece or "")):
                self.reasoning_tokens += 1
        if output.error is not None:
            self.error = str(output.error)
        if (output.is_finished() or self.stopped) and not self.finished:
            self.finished = True
            events += self._finish()
        return events

    @property
    def stopped(self) -> bool:
        """A stop string ended the reply."""
        return self.cutter.stopped

    def _feed(self, piece: str) -> list:
        return self._parse(self.cutter.feed(piece))

    def _parse(self, text: str) -> list:
        if not text:
            return []
        self.text += text
        return [("content", text)] if self.parser is None else self.parser.feed(text)

    def _finish(self) -> list:
        events = self._parse(self.cutter.flush())
        if self.parser is not None:
            events += self.parser.finish(truncated=self.truncated)
        return events

    @property
    def truncated(self) -> bool:
        return not self.stopped and self.max_new_tokens is not None and len(self.tokens) >= self.max_new_tokens

    def _record_logprob(self, i: int) -> None:
        spec = self.spec
        batched_sampler.settle(spec, i + 1)
        if spec is None or not spec.logprobs or i >= len(spec.chosen_logprobs):
            return
        top = [(token_text(self.tokenizer, t), lp) for t, lp in spec.top[i]] if spec.top_logprobs else []
        self.logprob_rows.append((token_text(self.tokenizer, self.tokens[i]), spec.chosen_logprobs[i], top))

    @property
    def logprobs(self) -> list[dict]:
        """The OpenAI logprobs entries of the tokens so far (built anew on each call)."""
        return [dict(_entry(token, lp), top_logprobs=[_entry(t, v) for t, v in top])
                for token, lp, top in self.logprob_rows]

    def logprobs_json(self, start: int, end: int) -> str:
        """Entries [start, end) as the JSON array a streamed chunk carries: the very text
        `dumps(self.logprobs[start:end])` writes, put together from each token's pieces."""
        entries = []
        for token, lp, top in self.logprob_rows[start:end]:
            tops = ",".join(f"{t.head}{json_number(v)}{t.tail}}}" for t, v in top)
            entries.append(f'{token.head}{json_number(lp)}{token.tail},"top_logprobs":[{tops}]}}')
        return "[" + ",".join(entries) + "]"

    # -- OpenAI shapes ------------------------------------------------------------------

    def call_id(self, index: int) -> str:
        if index not in self.call_ids:
            digest = hashlib.sha256(f"{self.request_id}/{index}".encode()).hexdigest()[:20]
            self.call_ids[index] = f"call_{digest}"
        return self.call_ids[index]

    def finish_reason(self) -> str:
        if self.truncated:
            return "length"
        return "tool_calls" if self.calls_ended else "stop"

    def usage(self, cached: int | None = None) -> dict:
        """The reply's usage; `cached` is the prompt's cached tokens where the caller knows them
        (the reply process, told by the server), else the scheduler's count in this process."""
        if cached is None:
            cached = usage.cached(self.request_id)
        return {"prompt_tokens": self.prompt_len, "completion_tokens": len(self.tokens),
                "total_tokens": self.prompt_len + len(self.tokens),
                "prompt_tokens_details": {"cached_tokens": cached},
                "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens}}

    def deltas(self, events) -> list[dict]:
        """Parser events -> OpenAI chunk deltas, in order."""
        out = []
        for event in events:
            kind = event[0]
            if kind == "content":
                out.append({"content": event[1]})
            elif kind == "reasoning":
                out.append(reasoning_delta(event[1]))
            elif kind == "call":
                out.append({"tool_calls": [{"index": event[1], "id": self.call_id(event[1]), "type": "function",
                                            "function": {"name": event[2], "arguments": ""}}]})
            elif kind == "args":
                out.append({"tool_calls": [{"index": event[1], "function": {"arguments": event[2]}}]})
            elif kind == "end":
                self.calls_ended += 1
        return out

    def message(self) -> dict:
        """The whole reply as a non-streamed assistant message (parsed in one pass)."""
        if self.parser is None:
            if self.stops:
                return {"role": "assistant", "content": self.text}
            tokens, skip = self.tokens, True
            if vllm_fields.on():  # stop_token_ids need not be special tokens; the text never holds them
                tokens, skip = [t for t in tokens if t not in self.eos], vllm_fields.get("skip_special_tokens", True)
            return {"role": "assistant", "content": self.tokenizer.decode(tokens, skip_special_tokens=skip)}
        parsed = glm_parser.parse(self.text, tools=self.tools, in_reasoning=self.opens_thinking,
                                  truncated=self.truncated, padded=self.padded)
        message = {"role": "assistant", "content": parsed["content"]}
        message.update(reasoning_message(parsed["reasoning"]))
        if parsed["calls"]:
            self.calls_ended = len(parsed["calls"])
            message["tool_calls"] = [
                {"id": self.call_id(i), "type": "function",
                 "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}
                for i, (name, args) in enumerate(parsed["calls"])]
        return message


def _reasoning_fields() -> tuple:
    policy = knobs.get("PB_REASONING_FIELD")
    return ("reasoning_content", "reasoning") if policy == "both" else (policy,)


def reasoning_delta(text: str) -> dict:
    return {field: text for field in _reasoning_fields()}


def reasoning_message(text: str) -> dict:
    return {field: text for field in _reasoning_fields()} if text else {}

"""What `patchbay soak` sends, and with which settings: the weighted families of request kinds,
distinct real-text prompts, the malformed cases and each case's right answers, the one Settings
object and the checks of the verb's input. Light to import (the CLI builds its parser from it);
`soak` runs the clients.
"""

from __future__ import annotations

import ipaddress
import random
import re
import socket
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from .prompt_texts import EDIT_TARGET, LONG_ARTICLE
from .prompts import PROMPTS, Prompt


class SoakError(RuntimeError):
    """One line for the operator; `code` is the exit status (2 bad input, 1 the run failed)."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# The families of traffic and their default weights (`--mix`); each family rotates over its kinds.
FAMILIES = {"chat": ("chat",), "stream": ("chat_stream",), "completion": ("completion",),
            "tool": ("tool_auto", "tool_required"), "json": ("json_schema",),
            "disconnect": ("disconnect_stream", "disconnect_timeout"),
            "responses": ("response", "response_stream", "disconnect_response"), "bad": ()}
DEFAULT_MIX = {"chat": 3, "stream": 3, "completion": 2, "tool": 2, "json": 2, "disconnect": 2, "responses": 1,
               "bad": 2}
RESPONSES = "/v1/responses"
# The first function of the ab suites' tool prompt: one keeps a tool request's prompt small enough
# for the tiny model's context (both are 373 tokens of its 512).
TOOLS = next(p.tools for p in PROMPTS if p.tools)[:1]
HUGE_MAX_TOKENS = 2**31  # one past int32: a server may clamp it to the context (PB_CONTEXT_LIMIT) or refuse it


@dataclass(frozen=True)
class Request:
    kind: str
    path: str  # /v1/chat/completions, /v1/completions or /v1/responses
    body: dict | None = None
    raw: bytes | None = None  # sent as is instead of `body` (malformed JSON)
    stream: bool = False
    bad: bool = False
    accept: tuple = ("2xx",)  # the status classes that are a right answer
    close_after: int = 0  # streamed: close the connection after this many data chunks
    client_timeout: float = 0.0  # whole: give up (and close) after this many seconds


def bad_cases(model: str, max_tokens: int) -> dict[str, Request]:
    """The malformed requests, by case name. Each is a client mistake the server must answer 4xx
    (in the OpenAI error shape) without harm to anyone else. Three may also be served: OpenAI's
    completions read a missing prompt as the start of a document (so an empty one too), and a
    max_tokens past the context may be clamped (PB_CONTEXT_LIMIT)."""
    user = [{"role": "user", "content": "Say hello in one short sentence."}]
    chat = "/v1/chat/completions"

    def c(name, body, path=chat, accept=("4xx",), **kw):
        return name, Request(f"bad_{name}", path, body=body, bad=True, accept=accept, **kw)

    cases = [
        c("messages_type", {"model": model, "messages": "hello", "max_tokens": max_tokens}),
        c("max_tokens_type", {"model": model, "messages": user, "max_tokens": "ten"}),
        c("temperature_type", {"model": model, "messages": user, "max_tokens": max_tokens, "temperature": "hot"}),
        c("missing_messages", {"model": model, "max_tokens": max_tokens}),
        c("empty_messages", {"model": model, "messages": [], "max_tokens": max_tokens}),
        c("unknown_role", {"model": model, "messages": [{"role": "wizard", "content": "hi"}],
                           "max_tokens": max_tokens}),
        c("unknown_model", {"model": "no-such-org/no-such-model", "messages": user, "max_tokens": max_tokens}),
        c("missing_prompt", {"model": model, "max_tokens": max_tokens}, "/v1/completions", ("2xx", "4xx")),
        c("empty_prompt", {"model": model, "prompt": "", "max_tokens": max_tokens}, "/v1/completions", ("2xx", "4xx")),
        c("unknown_tool_choice", {"model": model, "messages": user, "max_tokens": max_tokens, "tools": TOOLS,
                                  "tool_choice": {"type": "function", "function": {"name": "no_such_tool"}}}),
        c("schema_type", {"model": model, "messages": user, "max_tokens": max_tokens,
                          "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}}),
        c("malformed_json", None, raw=b'{"model": "' + model.encode() + b'", "messages": [{"role": "user", "content'),
        c("not_an_object", None, raw=b"[1, 2, 3]"),
    ]
    huge = Request("bad_huge_max_tokens", chat, body={"model": model, "messages": user, "max_tokens": HUGE_MAX_TOKENS,
                                                      "stream": True},
                   stream=True, bad=True, accept=("2xx", "4xx"), close_after=2)
    return dict(cases) | {"huge_max_tokens": huge}


_STRUCTURE = {"type": "object", "properties": {
    "title": {"type": "string"}, "points": {"type": "array", "items": {"type": "string"}},
    "confidence": {"type": "number"}}, "required": ["title", "points"]}
_WORDS = re.findall(r"\S+", LONG_ARTICLE + "\n" + EDIT_TARGET)
_INSTRUCTIONS = [p.instruction for p in PROMPTS if p.suite not in ("prefill", "long")]
TOOL_LEAD = "Use the tools where they help. "


def widest_prompts(words: int) -> list[Prompt]:
    """Prompts as long as the longest requests a soak sends (a tool request; the longest
    instruction) over a few slices of the text, the code among them: what `--prompt-words` must fit."""
    starts = sorted({0, len(_WORDS) // 3, 2 * len(_WORDS) // 3, len(re.findall(r"\S+", LONG_ARTICLE)),
                     max(0, len(_WORDS) - words)})
    return [Prompt(f"widest-{i}", "soak", lead, " ".join(_WORDS[i:i + words]), tools=tools) for i in starts
            for lead, tools in ((TOOL_LEAD, TOOLS), (max(_INSTRUCTIONS, key=len), []))]


class Traffic:
    """The request for each draw: weighted families, each rotating over its kinds, and prompts
    that differ from request to request (an instruction of the ab suites and a slice of real
    text), seeded so a run can be repeated. The first draws go round the families until every
    kind (each bad case too) has been sent once, so even a short soak sends all of them."""

    def __init__(self, model: str, mix: dict, bad: list[str], max_tokens: int, prompt_words: int,
                 disconnect_after: int, disconnect_timeout: float, seed: int = 0):
        self.model, self.max_tokens, self.prompt_words = model, max_tokens, prompt_words
        self.disconnect_after, self.disconnect_timeout = disconnect_after, disconnect_timeout
        self.bad = bad_cases(model, max_tokens)
        self.bad_names = bad
        self.families = [f for f, w in mix.items() if w > 0 and (f != "bad" or bad)]
        self.weights = [mix[f] for f in self.families]
        self.rng = random.Random(seed)
        self.turns = {f: 0 for f in FAMILIES}
        self.n = 0
        left = {f: len(bad) if f == "bad" else len(FAMILIES[f]) for f in self.families}
        self.first = []
        while any(left.values()):
            for f in self.families:
                if left[f]:
                    self.first.append(f)
                    left[f] -= 1
        self.first.reverse()  # popped from the end

    def kinds(self) -> list[str]:
        """Every kind this traffic sends."""
        return [k for f in self.families for k in (FAMILIES[f] or [f"bad_{b}" for b in self.bad_names])]

    def text(self, lead: str | None = None) -> str:
        """`lead` (default: the next instruction of the ab suites) and the next slice of real text."""
        self.n += 1
        start = (self.n * 97) % max(1, len(_WORDS) - self.prompt_words)
        body = " ".join(_WORDS[start:start + self.prompt_words])
        return f"{_INSTRUCTIONS[self.n % len(_INSTRUCTIONS)] if lead is None else lead}\n\n{body}"

    def next(self) -> Request:
        family = self.first.pop() if self.first else self.rng.choices(self.families, self.weights)[0]
        turn = self.turns[family]
        self.turns[family] += 1
        if family == "bad":
            return self.bad[self.bad_names[turn % len(self.bad_names)]]
        kind = FAMILIES[family][turn % len(FAMILIES[family])]
        return self.build(kind)

    def build(self, kind: str) -> Request:
        chat = "/v1/chat/completions"
        base = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.7, "top_p": 0.95}
        msgs = [{"role": "user", "content": self.text()}]
        if kind == "completion":
            return Request(kind, "/v1/completions", {**base, "prompt": self.text()})
        if kind == "chat_stream":
            return Request(kind, chat, {**base, "messages": msgs, "stream": True}, stream=True)
        if kind in ("tool_auto", "tool_required"):
            msgs = [{"role": "user", "content": self.text(TOOL_LEAD)}]
            return Request(kind, chat, {**base, "messages": msgs, "tools": TOOLS,
                                        "tool_choice": kind.removeprefix("tool_")})
        if kind == "json_schema":
            return Request(kind, chat, {**base, "messages": msgs, "response_format": {
                "type": "json_schema", "json_schema": {"name": "summary", "schema": _STRUCTURE}}})
        if kind == "disconnect_stream":
            return Request(kind, chat, {**base, "messages": msgs, "stream": True, "max_tokens": 4 * self.max_tokens},
                           stream=True, close_after=self.disconnect_after)
        if kind == "disconnect_timeout":
            return Request(kind, chat, {**base, "messages": msgs, "max_tokens": 4 * self.max_tokens},
                           client_timeout=self.disconnect_timeout)
        if kind in ("response", "response_stream", "disconnect_response"):  # the Responses API (upstream's)
            body = {"model": self.model, "input": self.text(), "max_output_tokens": self.max_tokens,
                    "temperature": 0.7, "top_p": 0.95, "stream": kind != "response"}
            if kind == "disconnect_response":
                return Request(kind, RESPONSES, {**body, "max_output_tokens": 4 * self.max_tokens}, stream=True,
                               close_after=self.disconnect_after)
            return Request(kind, RESPONSES, body, stream=body["stream"])
        return Request(kind, chat, {**base, "messages": msgs})



BAD_CASES = tuple(bad_cases("model", 1))


def parse_mix(text: str | None, no_bad: bool = False) -> dict:
    """The weights of the families: DEFAULT_MIX, or only those `chat=3,bad=1,...` names."""
    mix = {f: 0.0 for f in FAMILIES} if text else dict(DEFAULT_MIX)
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        name = name.strip()
        if name not in FAMILIES or not eq:
            raise SoakError(f"--mix {text}: expected FAMILY=WEIGHT,... with families {', '.join(FAMILIES)}", 2)
        try:
            mix[name] = float(value)
        except ValueError:
            raise SoakError(f"--mix {item}: the weight must be a number", 2) from None
        if mix[name] < 0:
            raise SoakError(f"--mix {item}: the weight must be 0 or more", 2)
    if no_bad:
        mix["bad"] = 0
    if not any(mix.values()):
        raise SoakError(f"--mix {text}: every weight is 0; nothing would be sent", 2)
    return mix


def parse_bad(text: str | None) -> list[str]:
    known = list(BAD_CASES)
    if not text:
        return known
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SoakError(f"--bad {text}: unknown case(s) {', '.join(unknown)} (known: {', '.join(known)})", 2)
    return names


def parse_duration(text: str) -> float:
    """Seconds from `90s`, `10m`, `1.5h` or a bare number of minutes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise SoakError(f"--duration {text}: expected a positive time such as 45s, 10m or 2h", 2)
    return float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "": 60}[m.group(2)]


def check_loopback(url: str, allow_remote: bool) -> None:
    """Refuse a server that is not on this machine's loopback unless the operator says so: a soak
    sends malformed and heavy traffic, and its RSS and slot checks read this machine's /proc."""
    host = urlsplit(url).hostname
    if not host:
        raise SoakError(f"--url {url}: expected http://HOST:PORT", 2)
    try:
        addrs = {ipaddress.ip_address(host)}
    except ValueError:
        try:
            addrs = {ipaddress.ip_address(a[4][0].split("%")[0]) for a in socket.getaddrinfo(host, None)}
        except socket.gaierror:
            raise SoakError(f"--url {url}: {host} does not resolve", 2) from None
    if not allow_remote and not all(a.is_loopback for a in addrs):
        raise SoakError(f"--url {url}: {host} is not a loopback address; a soak sends malformed and heavy traffic, "
                        "so pass --allow-remote to soak a server elsewhere", 2)


# ---- the settings --------------------------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    """One soak's settings; the verb's defaults are these fields' defaults."""
    url: str = "http://127.0.0.1:8000"
    model: str = ""
    build: str = "unknown"
    clients: int = 4
    duration_s: float = 600.0
    max_tokens: int = 32  # every good request's (the disconnecting kinds ask for 4x, to be cut off)
    timeout_s: float = 60.0  # a request's whole time, streamed or not
    disconnect_after: int = 3  # a disconnecting stream closes after this many data chunks
    disconnect_timeout_s: float = 0.2  # a disconnecting whole request gives up after this long
    mix: dict = field(default_factory=lambda: dict(DEFAULT_MIX))
    bad: tuple = BAD_CASES  # the bad cases sent, in turn, when the mix's `bad` weight is above 0
    prompt_words: int = 60  # real-text words a prompt carries after its instruction
    seed: int = 0
    sample_every_s: float = 2.0
    grace_s: float = 15.0  # after the run: how long the running count may take to come back to 0
    pid: int | None = None  # the server's, for RSS
    bucket_s: float | None = None  # latency buckets (None: a minute, narrower for short runs)
    rss_window_s: float = 60.0
    max_unexpected: int = 0
    max_leaked: int = 0
    max_rss_growth: float = 0.05

    def __post_init__(self):
        positive = {"--clients": self.clients, "--max-tokens": self.max_tokens, "--timeout": self.timeout_s,
                    "--disconnect-after": self.disconnect_after, "--disconnect-timeout": self.disconnect_timeout_s,
                    "--prompt-words": self.prompt_words, "--sample-every": self.sample_every_s,
                    "--rss-window": self.rss_window_s, "--duration": self.duration_s}
        for flag, value in positive.items():
            if not value > 0:
                raise SoakError(f"{flag} {value}: must be more than 0", 2)
        for flag, value in {"--grace": self.grace_s, "--max-unexpected": self.max_unexpected,
                            "--max-leaked": self.max_leaked, "--max-rss-growth": self.max_rss_growth}.items():
            if value < 0:
                raise SoakError(f"{flag} {value}: must be 0 or more", 2)
        if self.bucket_s is not None and self.bucket_s <= 0:
            raise SoakError(f"--bucket {self.bucket_s}: must be more than 0", 2)

    def traffic(self) -> "Traffic":
        return Traffic(self.model, self.mix, list(self.bad), self.max_tokens,
                       self.prompt_words, self.disconnect_after, self.disconnect_timeout_s, self.seed)

    def limits(self) -> dict:
        return {"max_unexpected": self.max_unexpected, "max_leaked": self.max_leaked,
                "max_rss_growth": self.max_rss_growth}

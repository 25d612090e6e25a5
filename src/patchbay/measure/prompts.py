"""The prompt suites `patchbay ab` sends: fixed, shipped in the repository, one shape of work each.

A prompt is an id, its suite, chat messages (the last one a user turn), optional OpenAI `tools`
and a default `max_tokens`. The `prefill` suite (one prompt of about 8,500 words, meant to be cut
to a prompt length with `--max-prompt-tokens`) times a long prompt's prefill; it runs only when
named. The body of the last user message may be cut at a word boundary to
fit a small model's context (`fit`); whatever precedes the body (the instruction) is kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from .prompt_texts import EDIT_TARGET, LONG_ARTICLE


@dataclass(frozen=True)
class Prompt:
    id: str
    suite: str
    instruction: str  # the last user turn's fixed part, never cut
    body: str = ""  # appended after the instruction; cut by words when it must fit
    max_tokens: int = 256
    system: str | None = None
    tools: list = field(default_factory=list)

    def messages(self) -> list[dict]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        text = self.instruction + ("\n\n" + self.body if self.body else "")
        return out + [{"role": "user", "content": text}]

    def words(self) -> int:
        return len(re.findall(r"\S+", self.body))

    def cut(self, words: int) -> "Prompt":
        """The same prompt with only the first `words` words of its body (spacing kept)."""
        ends = [m.end() for m in re.finditer(r"\S+", self.body)]
        if words >= len(ends):
            return self
        return replace(self, body=self.body[:ends[words - 1]] if words > 0 else "")


_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. Bergen"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search_trains", "description": "Train departures between two stations on a date.",
        "parameters": {"type": "object", "properties": {
            "origin": {"type": "string"}, "destination": {"type": "string"},
            "date": {"type": "string", "description": "YYYY-MM-DD"}},
            "required": ["origin", "destination", "date"]}}},
]

_SCHEMA = """\
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, country TEXT, created DATE);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id),
                     placed DATE, status TEXT);
CREATE TABLE order_lines (order_id INTEGER REFERENCES orders(id), sku TEXT, qty INTEGER,
                          unit_price NUMERIC);"""

PROMPTS: list[Prompt] = [
    Prompt("code-lru", "code", "Write a Python class LRUCache with get(key) and put(key, value) methods, "
           "O(1) each, using only the standard library. Include type hints and a short docstring.", max_tokens=512),
    Prompt("code-durations", "code", "Write a Python function parse_duration(text) that turns strings such as "
           "'1h30m', '45s' or '2d4h' into a number of seconds and raises ValueError on bad input. Then write "
           "three pytest tests for it.", max_tokens=512),
    Prompt("json-extract", "json", "Extract the facts from this note as a JSON object with the keys name, "
           "role, start_date (YYYY-MM-DD), languages (a list) and remote (true or false). Answer with the JSON "
           "only.", "Note: Marta Okafor joins the platform team as a site reliability engineer on the third of "
           "March 2025. She writes Go and Python, some Rust, and will work from Lisbon most weeks, coming to "
           "the office once a month.", max_tokens=256),
    Prompt("json-config", "json", "Produce a JSON configuration for a web service with three environments "
           "(dev, staging, prod). Each has a database URL, a pool size, a log level and a list of feature "
           "flags. Answer with the JSON only.", max_tokens=384),
    Prompt("sql-revenue", "sql", "Given this schema, write one SQL query that returns the ten customers with "
           "the highest total revenue from shipped orders in 2024, with their country and revenue, highest "
           "first.", _SCHEMA, max_tokens=256),
    Prompt("sql-monthly", "sql", "Given this schema, write a SQL query that counts orders per month and "
           "status for the last twelve months, and explain each clause in one line.", _SCHEMA, max_tokens=384),
    Prompt("prose-letter", "prose", "Write a friendly letter to a neighbour explaining that the shared garden "
           "fence will be repaired next week, what the work involves and why the gate will be closed for two "
           "days.", max_tokens=512),
    Prompt("prose-explain", "prose", "Explain to a curious twelve-year-old how a refrigerator keeps food cold, "
           "in four short paragraphs.", max_tokens=512, system="You are a patient science teacher."),
    Prompt("edit-ledger", "edit", "Here is a Python file. Fix the bug in Ledger.total_units, and add a method "
           "Ledger.value(prices) that returns the total stock value given a dict of sku to unit price. "
           "Reply with the whole corrected file and nothing else.", EDIT_TARGET, max_tokens=1024),
    Prompt("tool-weather", "tool", "What is the weather like in Bergen right now, and are there trains from "
           "Oslo to Bergen on 2025-06-14?", max_tokens=256, tools=_TOOLS),
    Prompt("count-100", "count", "Count from 1 to 100, one number per line, with nothing else.", max_tokens=600),
    Prompt("prefill-long", "prefill", "Read the five reports below, then answer in one sentence: which "
           "claim do they share?", "\n\n".join([LONG_ARTICLE] * 5), max_tokens=16),
    Prompt("long-summary", "long", "Read the article below, then summarize it in five bullet points and name "
           "the five questions it says a claim should answer.", LONG_ARTICLE, max_tokens=384),
]

SUITES = tuple(dict.fromkeys(p.suite for p in PROMPTS))
DEFAULT_SUITES = tuple(s for s in SUITES if s != "prefill")  # what runs when no suite is named


def select(suites: list[str] | None = None) -> list[Prompt]:
    """The prompts of the named suites (default: DEFAULT_SUITES), in the shipped order; ValueError
    names unknown ones."""
    if not suites:
        return [p for p in PROMPTS if p.suite in DEFAULT_SUITES]
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        raise ValueError(f"unknown suite(s) {', '.join(unknown)} (known: {', '.join(SUITES)})")
    return [p for p in PROMPTS if p.suite in suites]


def fit(prompt: Prompt, limit: int, count_tokens) -> Prompt:
    """Cut the prompt's body by words until `count_tokens(prompt)` is at most `limit`.

    Binary search over the number of words kept: a handful of counts per prompt that is too long.
    ValueError when even the instruction alone does not fit.
    """
    if count_tokens(prompt) <= limit:
        return prompt
    lo, hi = 0, prompt.words()  # lo words always fit (checked below), hi never
    if count_tokens(prompt.cut(0)) > limit:
        raise ValueError(f"{prompt.id}: its instruction alone is over {limit} prompt tokens")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if count_tokens(prompt.cut(mid)) <= limit:
            lo = mid
        else:
            hi = mid
    return prompt.cut(lo)

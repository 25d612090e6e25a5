"""`patchbay ab --workload agent`: what a coding agent's traffic looks like, as requests to time.

The texts are real: Python standard-library sources read at run time (from
`sysconfig.get_paths()['stdlib']`, picked and ordered by the seed) and the language reference's
prose (`pydoc_data.topics`, or the repository's own article where that module is missing), under
one of a few agent instructions (explain, edit this file, review, write tests, summarize). Every
stream gets texts no other stream gets, and every request opens with a system line of its own
(its session), so no two requests are alike and nothing of one is in the prefix cache of another;
only a conversation's later turns share their earlier turns' prefix, as an agent's do, and a
replay's sends are one prompt resent, as a retry or a regeneration is.

A mode is a way to send the same prompt: greedy, sampled, the model's generation defaults, JSON
under a schema, tools (auto or required), logprobs, a growing conversation, or a replay (the
prompt sent --turns times in a row, greedy: how much of it the prefix cache holds each time). The constrained
modes and logprobs sample like `sampled`, their free partner, so X/free isolates what X adds.
"""

from __future__ import annotations

import hashlib
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from .prompt_texts import LONG_ARTICLE
from .prompts import Prompt

MODES = ("greedy", "sampled", "defaults", "json", "tools-auto", "tools-required", "logprobs", "conversation",
         "replay")
DEFAULT_MODES = ("greedy", "sampled", "defaults", "json", "tools-required", "logprobs", "conversation")
FREE = "sampled"  # what json, tools-* and logprobs are compared with: the same sampling, unconstrained
SAMPLED = {"temperature": 0.7, "top_p": 0.95}
# (numerator, denominator) of the ratios a run reports, where both modes ran. The tools modes'
# prompts carry the tools (about 570 tokens more than their free partner's): tools-required
# against tools-auto is the grammar's cost with the same prompts.
PAIRS = (("sampled", "greedy"), ("defaults", "greedy"), ("json", FREE), ("tools-auto", FREE),
         ("tools-required", FREE), ("tools-required", "tools-auto"), ("logprobs", FREE))


def pair_label(num: str, den: str) -> str:
    """How a ratio is named: json/free for json against its free partner, sampled/greedy as it is."""
    return f"{num}/free" if den == FREE else f"{num}/{den}"


SESSION_SAMPLE = "You are a coding agent. Session 0f0f0f0f-0f0f."  # as long as a real session line

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the repository, or a range of its lines.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the repository root"},
            "start_line": {"type": "integer"}, "end_line": {"type": "integer"}}, "required": ["path"]}}},
    {"type": "function", "function": {
        "name": "edit_file", "description": "Replace one exact occurrence of old_text in a file with new_text.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"}, "old_text": {"type": "string"}, "new_text": {"type": "string"}},
            "required": ["path", "old_text", "new_text"]}}},
    {"type": "function", "function": {
        "name": "run_shell", "description": "Run a shell command in the repository; returns its output.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string"}, "timeout_s": {"type": "integer", "description": "Seconds, at most 600"}},
            "required": ["command"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the repository's files for a regular expression.",
        "parameters": {"type": "object", "properties": {
            "pattern": {"type": "string"}, "glob": {"type": "string", "description": "e.g. src/**/*.py"}},
            "required": ["pattern"]}}},
]

ANSWER_SCHEMA = {"type": "object", "properties": {
    "summary": {"type": "string"},
    "issues": {"type": "array", "items": {"type": "object", "properties": {
        "line": {"type": "integer"}, "problem": {"type": "string"}, "fix": {"type": "string"}},
        "required": ["line", "problem"]}},
    "confidence": {"type": "number"}}, "required": ["summary", "issues"]}

# (kind, instruction, source of its text)
TASKS = (
    ("explain", "Explain what this Python module does, then list its public functions and classes with one "
                "line each.", "code"),
    ("edit", "Here is a file of our repository. Add type hints where they are missing and fix anything you "
             "think is a bug. Reply with the whole edited file.", "code"),
    ("prose", "Summarize the documentation below in five bullet points for a new team member, then name two "
              "questions it leaves open.", "prose"),
    ("review", "Review this code as a senior engineer: name the three riskiest places, with their line, and "
               "propose a test for each.", "code"),
    ("tests", "Write pytest tests for the public functions of this module, covering the edge cases.", "code"),
)
TASK_KINDS = tuple(t[0] for t in TASKS)  # what --tasks names
TURN_LEAD = "Good. Now look at the next part as well and tell me what changes:"


class AgentError(ValueError):
    pass


def parse_modes(text: str | None) -> list[str]:
    """--modes: known names, in the order given (each once); a constrained mode brings its free partner."""
    names = [m.strip() for m in (text or ",".join(DEFAULT_MODES)).split(",") if m.strip()]
    unknown = [m for m in names if m not in MODES]
    if unknown or not names:
        raise AgentError(f"--modes {text}: unknown mode(s) {', '.join(unknown) or '(none given)'} "
                         f"(known: {', '.join(MODES)})")
    names = list(dict.fromkeys(names))
    if any(m in names for m in ("json", "tools-auto", "tools-required", "logprobs")) and FREE not in names:
        names.insert(0, FREE)
    return names


def parse_tasks(text: str | None) -> list[str] | None:
    """--tasks: kinds of TASKS, in TASKS' order (None: all of them)."""
    if text is None:
        return None
    names = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in names if k not in TASK_KINDS]
    if unknown or not names:
        raise AgentError(f"--tasks {text}: unknown task(s) {', '.join(unknown) or '(none given)'} "
                         f"(known: {', '.join(TASK_KINDS)})")
    return [k for k in TASK_KINDS if k in names]


# ---- the texts ---------------------------------------------------------------------------------


def stdlib_files(seed: int) -> list[Path]:
    """The standard library's Python sources of a useful size, in an order fixed by the seed."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "lib2to3")
    files = sorted(p for p in root.rglob("*.py")
                   if not set(p.relative_to(root).parts[:-1]) & set(skip) and 3000 <= p.stat().st_size <= 400_000)
    if not files:
        raise AgentError(f"no Python sources under {root}: this Python has no standard library sources")
    random.Random(seed).shuffle(files)
    return files


def prose_texts() -> list[str]:
    """The language reference's topics (prose), longest first; the repository's article without them."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        return [LONG_ARTICLE]
    texts = sorted((t for t in topics.values() if len(t) > 2000), key=lambda t: (-len(t), t))
    return texts or [LONG_ARTICLE]


class Texts:
    """Text number i: a code file (and the ones after it, for long prompts) or prose, distinct for
    every i below the pool's size (beyond it, the same files from a later line)."""

    def __init__(self, seed: int, tasks: list[str] | None = None):
        self.seed = seed
        self.tasks = [t for t in TASKS if t[0] in tasks] if tasks else list(TASKS)
        self.files = stdlib_files(seed)
        self.prose = prose_texts()
        self.root = Path(sysconfig.get_paths()["stdlib"])

    def task(self, i: int) -> tuple[str, str]:
        return self.tasks[(i + self.seed) % len(self.tasks)][:2]

    def body(self, i: int, chars: int) -> str:
        """At least `chars` characters (when there is that much text) of text number i."""
        source = self.tasks[(i + self.seed) % len(self.tasks)][2]
        if source == "prose":
            n = len(self.prose)
            k = i % n
            lap = i // n
            parts, size = [], 0
            while size < chars and len(parts) < n:
                text = self.prose[(k + len(parts)) % n]
                text = text[lap * 200 % max(1, len(text) // 2):] if not parts else text
                parts.append(text)
                size += len(text)
            return "\n\n".join(parts)
        n = len(self.files)
        k, lap = i % n, i // n
        parts, size = [], 0
        while size < chars and len(parts) < n:
            path = self.files[(k + len(parts)) % n]
            lines = path.read_text(errors="replace").splitlines(keepends=True)
            if not parts:
                lines = lines[lap * 40 % max(1, len(lines) // 2):]
            text = f"# file: {path.relative_to(self.root)}\n" + "".join(lines)
            parts.append(text)
            size += len(text)
        return "\n".join(parts)


def session_line(seed: int, *key) -> str:
    """The system line that opens a request (or a conversation): its own, so nothing is shared."""
    digest = hashlib.sha256(repr((seed, *key)).encode()).hexdigest()
    return f"You are a coding agent. Session {digest[:8]}-{digest[8:12]}."


@dataclass(frozen=True)
class Fitted:
    """The prompt lengths a run uses, after fitting to the model's context; `notes` say what changed."""
    context: int | None
    text_tokens: int  # a single-turn prompt (without tools)
    tools_tokens: int  # what the tools add to a prompt
    tools: int  # how many of TOOLS the tools modes send (all, unless the context is small)
    turn_tokens: int  # a conversation's new user text per turn
    first_turn_tokens: int  # a conversation's first prompt
    turns: int
    skipped: dict  # mode -> why it cannot run here
    notes: tuple = ()


def fit_lengths(context: int | None, prompt_tokens: int | None, max_tokens: int, modes: list[str], turns: int,
                turn_tokens: int, tools_tokens: dict) -> Fitted:
    """The prompt lengths to aim at: `prompt_tokens` (None: the most the context holds), lowered so
    that the longest request of each mode plus its reply fits the context; a mode that cannot fit is
    skipped, with the reason. `tools_tokens`: what the first k tools add to a prompt, by k (empty
    when no tools mode runs); a small context gets fewer tools, so that text still has room."""
    margin = 16  # the chat template's markers vary a little from prompt to prompt
    notes, skipped = [], {}
    if context is None and prompt_tokens is None:
        raise AgentError("--prompt-tokens max: the server does not report its context length in /v1/models; "
                         "give a number")
    if context is None:  # nothing to fit to: every tool, the lengths asked
        notes.append("the server does not report its context length in /v1/models: prompts are not fitted to it")
        return Fitted(None, prompt_tokens, tools_tokens.get(len(TOOLS), 0), len(TOOLS), turn_tokens, prompt_tokens,
                      turns, skipped, tuple(notes))
    room = context - max_tokens - margin
    k = max(tools_tokens, default=0)
    while k > 1 and room - tools_tokens[k] < max(64, room // 2):  # text keeps at least half the room
        k -= 1
    if tools_tokens and k < len(TOOLS):
        notes.append(f"the tools modes send {k} of the {len(TOOLS)} tools: the model's context is {context} tokens")
    tools = tools_tokens.get(k, 0)
    text = min(prompt_tokens or room, room - tools)
    if prompt_tokens and text < prompt_tokens:
        notes.append(f"--prompt-tokens {prompt_tokens} lowered to {text}: the model's context is {context} tokens "
                     f"(the reply's {max_tokens}" + (f" and the tools' {tools}" if tools else "") + " must fit too)")
    if text < 32:
        raise AgentError(f"the model's context ({context} tokens) leaves {text} tokens for a prompt after "
                         f"--max-tokens {max_tokens}" + (" and the tools" if tools else "")
                         + "; lower --max-tokens" + (" or drop the tools modes" if tools else ""))
    first, per_turn = text, turn_tokens
    if "conversation" in modes:
        step = lambda n: n + max_tokens + margin  # noqa: E731  (a turn's new text, the reply before it, markers)
        floor = min(text, 160)  # an instruction and some text
        first = min(text, room - (turns - 1) * step(per_turn))
        if first < floor and turns > 1:
            per_turn = max(0, (room - floor) // (turns - 1) - max_tokens - margin)
            first = min(text, room - (turns - 1) * step(per_turn))
        if per_turn < 32 or first < floor:
            skipped["conversation"] = (f"the model's context ({context} tokens) holds no {turns} turns of "
                                       f"{max_tokens}-token replies; lower --turns or --max-tokens")
        elif (first, per_turn) != (text, turn_tokens):
            notes.append(f"conversation: first prompt {first} tokens, {per_turn} new per turn, {turns} turns: "
                         f"the last turn must fit the model's context ({context} tokens)")
    return Fitted(context, text, tools, k, per_turn, first, turns, skipped, tuple(notes))


def fit_prompt(prompt: Prompt, target: int, count, tol: float = 0.03) -> Prompt:
    """The prompt with its body cut by words to at most `target` tokens and, where the text is long
    enough, at least (1 - tol) of it: interpolating search, a few counts for a long prompt."""
    lo, hi = 0, prompt.words()  # lo words fit; hi words may not
    tokens = count(prompt)
    if tokens <= target:
        return prompt
    base = count(prompt.cut(0))
    if base > target:
        raise AgentError(f"{prompt.id}: its instruction alone is over {target} prompt tokens")
    lo_t, hi_t = base, tokens
    while hi - lo > 1:
        guess = lo + int((hi - lo) * (target - lo_t) / max(1, hi_t - lo_t))
        guess = min(hi - 1, max(lo + 1, guess))
        t = count(prompt.cut(guess))
        if t <= target:
            lo, lo_t = guess, t
            if t >= target * (1 - tol):
                break
        else:
            hi, hi_t = guess, t
    return prompt.cut(lo)


def make_prompt(texts: Texts, i: int, target: int, count, chars_per_token: float, session: str) -> Prompt:
    """Prompt number i: its task's instruction and its text, fitted to `target` tokens with the
    given session line as its system message."""
    kind, instruction = texts.task(i)
    body = texts.body(i, int(target * chars_per_token * 1.6) + 400)
    prompt = Prompt(f"{kind}-{i}", kind, instruction, body, system=session)
    return fit_prompt(prompt, target, count)


def turn_message(texts: Texts, i: int, target: int, count, chars_per_token: float) -> str:
    """A conversation's new user text: a lead and about `target` tokens of text number i."""
    body = texts.body(i, int(target * chars_per_token * 1.6) + 200)
    return fit_prompt(Prompt(f"turn-{i}", "turn", TURN_LEAD, body), target, count).messages()[-1]["content"]


# ---- the request bodies ------------------------------------------------------------------------


def body(mode: str, model: str, messages: list[dict], max_tokens: int, seed: int, knobs: dict | None = None,
         tools: int = len(TOOLS)) -> dict:
    """The streamed chat request of `mode` (usage asked for in the last chunk)."""
    out = {"model": model, "messages": messages, "stream": True, "stream_options": {"include_usage": True},
           "max_tokens": max_tokens}
    if mode in ("greedy", "replay"):
        out["temperature"] = 0
    elif mode != "defaults":  # the model's generation defaults: no sampling field at all
        out.update(SAMPLED, seed=seed)
    if mode == "json":
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "review", "schema": ANSWER_SCHEMA, "strict": True}}
    elif mode.startswith("tools-"):
        out.update(tools=TOOLS[:tools], tool_choice=mode.removeprefix("tools-"))
    elif mode == "logprobs":
        out.update(logprobs=True, top_logprobs=5)
    if knobs:
        out["pb_knobs"] = knobs
    return out


def request_seed(seed: int, *key) -> int:
    """A sampled request's seed: fixed by the run's seed and the request's place, the same in both arms."""
    return int(hashlib.sha256(repr(("seed", seed, *key)).encode()).hexdigest()[:8], 16)


def words(text: str) -> int:
    return len(re.findall(r"\S+", text))


# ---- the command line ------------------------------------------------------------------------

SUITE_ONLY = ("suites", "max_prompt_tokens", "cold", "distinct_copies")  # ab flags of the suites workload
AGENT_ONLY = ("modes", "tasks", "prompt_tokens", "requests", "turns", "turn_tokens")


def add_arguments(ab) -> None:
    """`ab`'s flags for the agent workload (their defaults live here)."""
    ab.add_argument("--workload", choices=("suites", "agent"), default="suites",
                    help="suites: the shipped prompt suites, greedy (default); agent: a coding agent's traffic "
                         "(distinct real-text prompts, --modes, streams sending requests one after another)")
    ab.add_argument("--modes", metavar="MODE,...", help=f"agent: the request modes, paired in one run (default: "
                    f"{','.join(DEFAULT_MODES)}; known: {', '.join(MODES)})")
    ab.add_argument("--tasks", metavar="KIND,...", help="agent: the instructions its prompts carry, taken in turn "
                    f"(default: all of {', '.join(TASK_KINDS)}): edit alone, say, for the replies that "
                    "copy their prompt")
    ab.add_argument("--prompt-tokens", metavar="N|max", help="agent: prompt length in tokens, lowered to fit the "
                    "context /v1/models reports; max: the most the context holds (default: 600)")
    ab.add_argument("--requests", type=int, help="agent: requests each stream sends one after another in a pass "
                    "(default: 2)")
    ab.add_argument("--turns", type=int, help="agent: a conversation's turns, each resending the whole history, "
                    "and a replay's sends of one prompt (default: 4)")
    ab.add_argument("--turn-tokens", type=int, help="agent: new user tokens a conversation turn adds (default: 300)")


def settings(args) -> dict:
    """The agent workload's settings from `ab`'s arguments, checked (AgentError names the flag)."""
    given = [f"--{name.replace('_', '-')}" for name in SUITE_ONLY if getattr(args, name)]
    if given:
        raise AgentError(f"{', '.join(given)}: not flags of --workload agent (its prompts are sized by "
                         "--prompt-tokens and never cached)")
    text = args.prompt_tokens or "600"
    if text == "max":
        prompt_tokens = None
    elif text.isdigit() and int(text) >= 32:
        prompt_tokens = int(text)
    else:
        raise AgentError(f"--prompt-tokens {text}: a whole number of at least 32, or max")
    out = {"modes": parse_modes(args.modes), "tasks": parse_tasks(args.tasks), "prompt_tokens": prompt_tokens,
           "requests": args.requests or 2,
           "turns": args.turns or 4, "turn_tokens": args.turn_tokens or 300, "max_tokens": args.max_tokens or 256}
    for name in ("requests", "turns", "turn_tokens", "max_tokens"):
        if out[name] < 1:
            raise AgentError(f"--{name.replace('_', '-')} {out[name]}: must be at least 1")
    return out

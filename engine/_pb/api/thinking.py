"""PB_THINKING_BUDGET: replies that think for a bounded number of tokens, then answer.

GLM thinks before it answers. Left alone, a reply may think until `max_tokens` and come
back empty with finish_reason length, and a grammar that starts after `</think>` (0130,
0140) never gets its turn. With the knob at N > 0 every reply that thinks gets a budget:
`reasoning_effort` low / medium / high pick one of EFFORT_BUDGETS, none and minimal none
at all (thinking closed at once), no effort the knob's own N; never more than half of the
reply's max_tokens, so whatever follows the thinking has room. Once the reply has thought
for its budget, `</think>` is its next token, and from there the request's constraint
(response_format, guided fields, an enforced tool_choice) or free text follows.

The budget is a mask (the sampler's per-request `Spec.mask`), wrapped around the request's
grammar constraint, or around a constraint without a grammar that only follows the
thinking phases. The same knob makes what a grammar admits tight, so a constrained reply
cannot spend its tokens on padding: JSON with "," and ":" and no whitespace between its
tokens, tool-call argument values with nothing around them, and tool_choice required
ending the turn once its calls are written instead of letting free text follow them.
"""

import re

import torch

from .. import knobs


EFFORT_BUDGETS = {"none": 0, "minimal": 0, "low": 512, "medium": 2048, "high": 8192}
JSON_SEPARATORS = (",", ":")
TOOL_CALL, END_TOOL_CALL = "<tool_call>", "</tool_call>"


def on() -> bool:
    return bool(knobs.get("PB_THINKING_BUDGET"))


def budget_for(effort, max_new_tokens) -> int:
    """The thinking budget of a reply: its effort's, else the knob's; at most half its max_tokens."""
    budget = knobs.get("PB_THINKING_BUDGET") if effort is None else EFFORT_BUDGETS[effort]
    if max_new_tokens:
        budget = min(budget, max_new_tokens // 2)
    return budget


def check_effort(effort) -> None:
    if effort is not None and effort not in EFFORT_BUDGETS:
        raise knobs.PBRequestError(400, f"reasoning_effort={effort!r} is not supported (allowed: "
                                        f"{', '.join(EFFORT_BUDGETS)})", code="invalid_messages",
                                   param="reasoning_effort")


class Budget:
    """A Spec mask: the inner constraint's, `</think>` forced once thinking used its budget and,
    after a complete call of tool_choice required, the turn ended when another call as long as
    the longest so far would not fit in max_tokens (a call begun there would be cut and dropped).

    `make_inner()` builds the constraint that follows the reply's phases (a grammar.Constraint,
    with or without a grammar); its `phase` is "think" while the reply thinks. The mask runs
    once per token of the reply, so the token count at the first step in "think" is where
    the thinking began (0 when the prompt opened it). `stops`: the end-of-turn tokens when the
    inner grammar is tool_choice required's calls, else None."""

    def __init__(self, make_inner, end_think: int, budget: int, max_new_tokens=None, stops=None):
        self.make_inner, self.end_think, self.budget = make_inner, end_think, budget
        self.max_new_tokens, self.stops = max_new_tokens, stops
        self.inner = make_inner()
        self.began = None  # how many reply tokens came before the thinking
        self.mark, self.longest = None, 0  # where the current call began; the longest call

    def fresh(self) -> "Budget":
        """The same budget for another reply (another choice of an n > 1 request)."""
        return Budget(self.make_inner, self.end_think, self.budget, self.max_new_tokens, self.stops)

    @property
    def matcher(self):
        return getattr(self.inner, "matcher", None)

    def __call__(self, spec, scores: torch.Tensor) -> torch.Tensor:
        scores = self.inner(spec, scores)
        if self.inner.phase == "think":
            if self.began is None:
                self.began = len(spec.tokens)
            if len(spec.tokens) - self.began >= self.budget:
                scores.fill_(float("-inf"))
                scores[self.end_think] = 0.0
        elif self.stops is not None and self.inner.phase == "body":
            self._end_when_full(spec, scores)
        return scores

    def _may_end(self, spec, scores: torch.Tensor, token: int) -> bool:
        allowed = self.inner.allows(token)
        if allowed is None:
            return bool(scores[token] > float("-inf"))  # a wait for the step's logits
        # 0640 filled the grammar's mask on the host: read it there. Before the mask only min_tokens
        # can have ruled the token out (raw logits are finite, logit_bias is at most 100 away).
        held = len(spec.tokens) < spec.min_tokens and token in spec.suppress
        return allowed and not held

    def _end_when_full(self, spec, scores: torch.Tensor) -> None:
        # The required calls' grammar may end only just after a complete call: each step where
        # it may end closes one (read from the grammar, whatever tokens spelled the call).
        if self.mark is None:
            self.mark = len(spec.tokens)
        ends = [t for t in self.stops if self._may_end(spec, scores, t)]
        if not ends:
            return
        self.longest = max(self.longest, len(spec.tokens) - self.mark)
        self.mark = len(spec.tokens)
        if self.max_new_tokens and self.max_new_tokens - len(spec.tokens) <= self.longest:
            ends = self.inner.device_ids(ends, scores)  # under 0640 kept on the device: no wait
            keep = scores[ends].clone()  # another call would be cut: end the turn
            scores.fill_(float("-inf"))
            scores[ends] = keep


# ---- tight grammars ---------------------------------------------------------------------------

# xgrammar writes each optional whitespace slot of a grammar (max_whitespace_cnt=1) as a rule
# of its own: `name ::= ("" | ([ \n\r\t]))`.
_WS_RULE = re.compile(r'^(\w+) ::= \(""\s*\|\s*\(\[ \\n\\r\\t\]\)\)$', re.M)
_ARG_MARKERS = ('"<arg_key>', '"</arg_key>"', '"</arg_value>"')


def compact_tool_grammar(ebnf: str) -> str:
    """A GLM tool-call grammar (xgrammar's EBNF) with no whitespace inside argument values.

    The slots just inside <arg_value>…</arg_value> and those inside JSON values go; the ones
    between the call's parts stay (one newline there is how GLM-4.5 writes a call, and the
    parser reads it), so a value is exactly the text the schema constrained."""
    names = set(_WS_RULE.findall(ebnf))
    keep = set()
    for line in ebnf.splitlines():
        if "::=" not in line or not any(m in line for m in _ARG_MARKERS):
            continue
        parts = re.findall(r'"(?:[^"\\]|\\.)*"|\w+', line.split("::=", 1)[1])
        for i, part in enumerate(parts):
            if part not in names:
                continue
            after_open = i > 0 and parts[i - 1] == '"<arg_value>"'
            before_close = i + 1 < len(parts) and parts[i + 1] == '"</arg_value>"'
            if not (after_open or before_close):
                keep.add(part)
    return _WS_RULE.sub(lambda m: m.group(0) if m.group(1) in keep else f'{m.group(1)} ::= ("")', ebnf)


def calls_then_end(tag, parallel: bool, markers=None):
    """tool_choice required or a named function: the calls and nothing after them (xgrammar's
    structure for required lets free text follow the first call, so a reply could ramble on
    until max_tokens). `markers`: the ids of the <tool_call> and </tool_call> tokens; a call
    then opens and closes with those tokens, never spelled in pieces, so where a call ends is
    a step of its own (where the turn may end)."""
    from xgrammar import structural_tag as st

    fmt = tag.format
    tags = fmt.tags if isinstance(fmt, st.TriggeredTagsFormat) else [fmt] if isinstance(fmt, st.TagFormat) else None
    if tags is None:
        return tag
    if markers is not None and all(isinstance(t.begin, str) and t.begin.startswith(TOOL_CALL)
                                   and t.end == END_TOOL_CALL for t in tags):
        opening, closing = (st.TokenFormat(token=t) for t in markers)
        tags = [st.TagFormat(begin=opening, end=closing, content=st.SequenceFormat(elements=[
                    st.ConstStringFormat(value=t.begin[len(TOOL_CALL):]), t.content])) for t in tags]
    if isinstance(fmt, st.TriggeredTagsFormat):
        tag.format = st.TagsWithSeparatorFormat(tags=tags, separator="", at_least_one=True,
                                                stop_after_first=not parallel)
    else:
        tag.format = tags[0]
    return tag


def compile_tool_tag(comp, tag, parallel: bool, markers=None):
    """The tool grammar of tool_choice required or a named function, tight."""
    import xgrammar as xgr

    grammar = xgr.Grammar.from_structural_tag(calls_then_end(tag, parallel, markers))
    return comp.compile_grammar(compact_tool_grammar(str(grammar)))

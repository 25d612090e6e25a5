"""PB_STRUCTURED_OUTPUT: replies constrained token by token with xgrammar.

A request names what its reply must be:
- `response_format`: {"type": "json_object"}, or {"type": "json_schema", "json_schema":
  {"name", "schema", "strict"}} (OpenAI);
- `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`, or
  `structured_outputs`: {"json" | "regex" | "choice" | "grammar": ...} (vLLM's names).
The constraint is a per-request token mask applied inside continuous batching by the
sampler (0100), so each row of a batch follows its own grammar and a constrained reply is
the same whether it runs alone or beside others. Thinking is left free: the grammar starts
once the reply's `</think>` is out (or at once when the prompt turned thinking off).
Schema keywords xgrammar does not enforce are refused with a 400 naming the keyword and
where it is, rather than silently ignored.
"""

import json
import threading

import torch

from .. import knobs
from . import thinking


# Enforced by xgrammar 0.2.9 (each checked against a violating and a valid text in tests).
ENFORCED = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems", "enum", "const",
    "anyOf", "oneOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "pattern", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems",
    "minProperties", "maxProperties", "propertyNames",
}
# Change nothing about what is valid.
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
               "readOnly", "writeOnly", "strict"}
FORMATS = {"date", "time", "date-time", "email", "uri", "uuid", "ipv4", "ipv6", "hostname"}
THINK, END_THINK = "<think>", "</think>"


def on() -> bool:
    return bool(knobs.get("PB_STRUCTURED_OUTPUT"))


def _bad(message: str, param: str) -> knobs.PBRequestError:
    return knobs.PBRequestError(400, message, code="invalid_schema", param=param)


def check_schema(schema, param: str, where: str = "$") -> None:
    """Refuse what the grammar backend would not enforce, naming the keyword and its place."""
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise _bad(f"{param}: the schema at {where} must be an object", param)
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED and not (key == "multipleOf" and schema.get("type") == "integer"):
            raise _bad(f"{param}: schema keyword '{key}' at {where} cannot be enforced by this server "
                       f"(supported: {', '.join(sorted(ENFORCED))}; multipleOf for integers)", param)
        if key == "format" and value not in FORMATS:
            raise _bad(f"{param}: format '{value}' at {where} cannot be enforced "
                       f"(supported: {', '.join(sorted(FORMATS))})", param)
        if key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise _bad(f"{param}: {key} at {where} must be an object", param)
            for name, sub in value.items():
                check_schema(sub, param, f"{where}.{key}.{name}")
        elif key in ("items", "additionalProperties", "propertyNames"):
            check_schema(value, param, f"{where}.{key}")
        elif key in ("anyOf", "oneOf", "prefixItems"):
            if not isinstance(value, list):
                raise _bad(f"{param}: {key} at {where} must be a list", param)
            for i, sub in enumerate(value):
                check_schema(sub, param, f"{where}.{key}[{i}]")


# ---- compiling -----------------------------------------------------------------------------

_compilers: dict = {}
_compiler_lock = threading.Lock()


def compiler(tokenizer, vocab_size: int, stop_ids):
    """One xgrammar compiler per tokenizer (its vocabulary table takes a moment to build)."""
    import xgrammar as xgr

    key = (id(tokenizer), vocab_size, tuple(stop_ids))
    with _compiler_lock:
        if key not in _compilers:
            info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids))
            _compilers[key] = xgr.GrammarCompiler(info)
        return _compilers[key]


def _schema_arg(value, param: str) -> dict:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _bad(f"{param} is not valid JSON", param) from None
    check_schema(value, param)
    return value


def requested(body: dict, taken: dict) -> tuple | None:
    """What the request asks its reply to be: (kind, value, param), or None."""
    found = []
    fmt = body.get("response_format")
    if fmt is not None:
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind == "json_object":
            found.append(("json_object", None, "response_format"))
        elif kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise _bad("response_format.json_schema must hold `schema`", "response_format")
            found.append(("json", _schema_arg(spec["schema"], "response_format"), "response_format"))
        elif kind != "text":
            raise _bad("response_format.type must be text, json_object or json_schema", "response_format")
    outputs = taken.get("structured_outputs") or {}
    if not isinstance(outputs, dict):
        raise _bad('structured_outputs must be an object such as {"json": {...}}', "structured_outputs")
    outputs = dict(outputs)
    for name in ("json", "regex", "choice", "grammar"):
        if f"guided_{name}" in taken:
            outputs[name] = taken[f"guided_{name}"]
    for name, value in outputs.items():
        param = f"structured_outputs.{name}"
        if name == "json":
            found.append(("json", _schema_arg(value, param), param))
        elif name in ("regex", "grammar") and isinstance(value, str):
            found.append((name, value, param))
        elif name == "choice" and isinstance(value, list) and value and all(isinstance(c, str) for c in value):
            found.append(("choice", value, param))
        else:
            raise _bad(f"{param} is not supported here (json: a schema, regex: a string, choice: a list of "
                       "strings, grammar: an EBNF string)", param)
    if len(found) > 1:
        raise _bad("give one structured-output constraint, not " + ", ".join(f[2] for f in found), found[1][2])
    return found[0] if found else None


def compile_body(comp, kind: str, value, param: str):
    """The grammar the reply (after its thinking) must match."""
    try:
        # Compact JSON: no free whitespace between tokens, so a reply cannot pad itself forever;
        # with 0150 not even after "," and ":".
        tight = {"separators": thinking.JSON_SEPARATORS} if thinking.on() else {}
        if kind == "json_object":
            return comp.compile_json_schema('{"type": "object"}', any_whitespace=False, strict_mode=False, **tight)
        if kind == "json":
            return comp.compile_json_schema(json.dumps(value), any_whitespace=False, strict_mode=False, **tight)
        if kind == "regex":
            return comp.compile_regex(value)
        if kind == "choice":
            return comp.compile_grammar("root ::= " + " | ".join(json.dumps(c) for c in value))
        return comp.compile_grammar(value)
    except knobs.PBRequestError:
        raise
    except Exception as e:  # xgrammar's own message says what it could not compile
        raise _bad(f"{param} could not be compiled: {str(e).splitlines()[-1][:300]}", param) from None


# ---- the mask ---------------------------------------------------------------------------------


class Constraint:
    """A request's token mask: free thinking first, then its compiled grammar.

    Phases: "pre" (the reply may still open its thinking with one optional newline and
    <think>; "open" once the newline is out), "think" (free until </think>), "post" (one
    optional newline), "body" (the grammar). A prompt that already closed the thinking starts in "body"; one that opened
    it starts in "think". Tokens are read from the Spec the sampler keeps, so the
    grammar follows exactly what was emitted.
    """

    def __init__(self, compiled, tokenizer, vocab_size: int, phase: str, forbid=()):
        import xgrammar as xgr

        self.matcher = xgr.GrammarMatcher(compiled) if compiled is not None else None
        self.bitmask = xgr.allocate_token_bitmask(1, vocab_size) if compiled is not None else None
        self.phase = phase
        self.seen = 0
        ids = tokenizer.convert_tokens_to_ids
        self.think, self.end_think = ids(THINK), ids(END_THINK)
        self.newlines = {t for t in (tokenizer.encode("\n", add_special_tokens=False) or [])[:1]}
        self.forbid = [ids(t) for t in forbid]
        self.vocab_size = vocab_size
        self.ready = None  # 0640: (token count, device bitmask row, host bitmask row) for this step
        self.overlap = False  # 0640 prepares this constraint's steps
        self._on_device: dict = {}
        self.accepted = None  # while draft_masks runs: how many tokens the grammar took

    def _advance(self, token: int) -> None:
        phase = self.phase
        if phase == "pre" and token in self.newlines:
            self.phase = "open"
        elif phase in ("pre", "open") and token == self.think:
            self.phase = "think"
        elif phase == "think":
            if token == self.end_think:
                self.phase = "post"
        elif phase == "post" and token in self.newlines:
            self.phase = "body"
        else:
            self.phase = "body"
            if self.matcher is not None and not self.matcher.is_terminated():
                if not self.matcher.accept_token(token):
                    raise RuntimeError(f"grammar rejected token {token} it allowed")
                if self.accepted is not None:
                    self.accepted += 1

    def catch_up(self, spec) -> None:
        """Advance the phases and the grammar by the tokens the Spec chose since the last call."""
        for token in spec.tokens[self.seen:]:
            self._advance(token)
        self.seen = len(spec.tokens)

    def needs_bitmask(self) -> bool:
        """Whether this step's mask is the grammar's next-token bitmask (not free thinking, not
        the stop tokens after the grammar ended)."""
        return self.phase != "think" and self.matcher is not None and not self.matcher.is_terminated()

    def _extra(self) -> list:
        """Tokens the phase before the grammar allows besides it (opening or skipping the thinking)."""
        if self.phase == "pre":
            return [self.think, *self.newlines]
        if self.phase == "open":
            return [self.think]
        if self.phase == "post":
            return list(self.newlines)
        return []

    def device_ids(self, ids: list, scores: torch.Tensor):
        """`ids` to index `scores` with: a device tensor kept for the request under 0640 (indexing a
        GPU tensor with a list copies it there and waits), the list itself otherwise."""
        if not self.overlap:
            return ids
        key = (tuple(ids), scores.device)
        if key not in self._on_device:
            self._on_device[key] = torch.tensor(ids, dtype=torch.long).to(scores.device)
        return self._on_device[key]

    def __call__(self, spec, scores: torch.Tensor) -> torch.Tensor:
        import xgrammar as xgr

        self.catch_up(spec)
        if self.forbid:
            scores[self.device_ids(self.forbid, scores)] = float("-inf")
        if self.phase == "think" or self.matcher is None:
            return scores
        if self.matcher.is_terminated():
            # The grammar took its stop token, so the reply has ended; with async batching the row can
            # still be in the next step, whose token is dropped. Only a stop token may be chosen there.
            stops = self.device_ids(list(self.matcher.stop_token_ids), scores)
            keep = scores[stops].clone()
            scores.fill_(float("-inf"))
            scores[stops] = keep
            return scores
        if self.ready is not None and self.ready[0] == self.seen:
            return scores  # 0640: the step's bitmask (the phase's extra tokens and forbid in it) applies later
        self.matcher.fill_next_token_bitmask(self.bitmask)
        extra = self._extra()
        if extra:
            keep = scores[extra].clone()
        xgr.apply_token_bitmask_inplace(scores.view(1, -1), self.bitmask.to(scores.device))
        if extra:
            scores[extra] = keep
        return scores

    def finish_row(self, row: torch.Tensor) -> None:
        """A bitmask row the grammar filled -> the whole step's mask: the tokens the phase before the
        grammar allows besides it set, the forbidden ones cleared (what __call__ leaves finite)."""
        for token in self._extra():
            _put(row, token, True)
        for token in self.forbid:
            _put(row, token, False)

    def allows(self, token: int) -> bool | None:
        """Whether this step's bitmask, filled on the host by 0640, allows `token` (None: unknown)."""
        if self.ready is None or self.ready[0] != self.seen:
            return None
        word = int(self.ready[2][token // 32])
        return bool((word >> (token % 32)) & 1)

    def draft_masks(self, spec, draft: list, phases: list | None = None) -> torch.Tensor:
        """Drafting-ready (0800): the tokens allowed at this step and after each of `draft`'s tokens,
        as bitmask rows [k + 1, words] on the host (row i is the mask the step after draft[:i]
        would use). Rows stop at the first draft token the mask refuses: positions after it are
        never reached. `phases` gets each row's phase. The grammar and the phases are left as
        they were."""
        import xgrammar as xgr

        self.catch_up(spec)
        words = xgr.get_bitmask_shape(1, self.vocab_size)[1]
        rows = torch.zeros(len(draft) + 1, words, dtype=torch.int32)
        phase, self.accepted = self.phase, 0
        try:
            for i in range(len(draft) + 1):
                if phases is not None:
                    phases.append(self.phase)
                self._mask_row(rows[i])
                if i == len(draft) or not (int(rows[i][draft[i] // 32]) >> (draft[i] % 32)) & 1:
                    return rows[:i + 1]
                self._advance(draft[i])
            return rows
        finally:
            if self.accepted:
                self.matcher.rollback(self.accepted)
            self.phase, self.accepted = phase, None

    def _mask_row(self, row: torch.Tensor) -> None:
        """The allowed tokens of the current state as one bitmask row (what __call__ leaves finite)."""
        if self.phase == "think" or self.matcher is None:
            row.fill_(-1)
            for token in range(self.vocab_size, row.numel() * 32):
                _put(row, token, False)
        elif self.matcher.is_terminated():
            row.zero_()
            for token in self.matcher.stop_token_ids:
                _put(row, token, True)
        else:
            self.matcher.fill_next_token_bitmask(row.view(1, -1))
        self.finish_row(row)  # extra tokens only before the grammar (already set without one); forbid always


def _put(row: torch.Tensor, token: int, on: bool) -> None:
    """Set or clear one token's bit in an int32 bitmask row."""
    bit = 1 << (token % 32)
    value = int(row[token // 32]) & 0xFFFFFFFF
    value = value | bit if on else value & ~bit
    row[token // 32] = value - (1 << 32) if value >= 1 << 31 else value


def start_phase(tokenizer, input_ids) -> str:
    """Where a reply starts, from how the prompt ends."""
    tail = tokenizer.decode(list(input_ids)[-4:]).rstrip()
    if tail.endswith(END_THINK):
        return "body"
    if tail.endswith(THINK):
        return "think"
    return "pre" if tokenizer.convert_tokens_to_ids(THINK) != tokenizer.unk_token_id else "body"


def constraint_for(body: dict, taken: dict, tokenizer, model, gen_config, input_ids) -> Constraint | None:
    """The request's structured-output constraint (None when it asks for none or the knob is off)."""
    if not on():
        return None
    asked = requested(body, taken)
    if asked is None:
        return None
    vocab = model.config.get_text_config().vocab_size
    eos = gen_config.eos_token_id
    stops = eos if isinstance(eos, (list, tuple)) else [eos]
    comp = compiler(tokenizer, vocab, stops)
    compiled = compile_body(comp, *asked)
    return Constraint(compiled, tokenizer, vocab, start_phase(tokenizer, input_ids))


FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs")


# ---- tool_choice (0140) -----------------------------------------------------------------------

CALL_TOKENS = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")


def tools_on() -> bool:
    return bool(knobs.get("PB_TOOL_CHOICE"))


def _tool_names(tools) -> list[str]:
    names = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise knobs.PBRequestError(400, f"tools[{i}] must be {{\"type\": \"function\", \"function\": "
                                            "{\"name\": …, \"parameters\": …}}", code="invalid_tools",
                                       param="tools")
        names.append(fn["name"])
    return names


def asks_constraint(body: dict, taken: dict) -> bool:
    """Whether the request holds a field constraint_for reads (it may compile a grammar then)."""
    return body.get("response_format") is not None or any(key in taken for key in FIELDS)


def asks_tool_grammar(body: dict) -> bool:
    """Whether tool_constraint may compile a grammar for the request: tools with a tool_choice other
    than auto or none, parallel_tool_calls not true, or a strict tool (True where unsure)."""
    tools = body.get("tools")
    if not tools:
        return False
    try:
        strict = any((t.get("function") or {}).get("strict") for t in tools)
        serial = body.get("parallel_tool_calls", True) is not True
        return body.get("tool_choice", "auto") not in ("auto", "none") or serial or strict
    except Exception:  # noqa: BLE001 - a malformed tool: tool_constraint says what is wrong
        return True


def tool_constraint(body: dict, tokenizer, model, gen_config, input_ids) -> Constraint | None:
    """tool_choice none / required / a named function, parallel_tool_calls false and strict
    tools, enforced with xgrammar's GLM tool-call structure (None: nothing to enforce)."""
    if not tools_on():
        return None
    tools = body.get("tools") or []
    names = _tool_names(tools)
    choice = body.get("tool_choice", "auto")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise knobs.PBRequestError(400, "parallel_tool_calls must be true or false", param="parallel_tool_calls")
    named = None
    if isinstance(choice, dict):
        named = (choice.get("function") or {}).get("name") if choice.get("type") == "function" else None
        if named not in names:
            raise knobs.PBRequestError(400, f"tool_choice names {named!r}, which is not among the tools "
                                            f"({', '.join(names) or 'none given'})", code="invalid_tool_choice",
                                       param="tool_choice")
    elif choice not in ("none", "auto", "required"):
        raise knobs.PBRequestError(400, "tool_choice must be none, auto, required or "
                                        '{"type": "function", "function": {"name": …}}',
                                   code="invalid_tool_choice", param="tool_choice")
    elif choice == "required" and not tools:
        raise knobs.PBRequestError(400, "tool_choice required needs tools", code="invalid_tool_choice",
                                   param="tool_choice")
    vocab = model.config.get_text_config().vocab_size
    if choice == "none" or not tools:
        return Constraint(None, tokenizer, vocab, "body", forbid=CALL_TOKENS) if tools else None
    if not asks_tool_grammar(body):  # auto, parallel and no strict tool: nothing to enforce
        return None
    for tool, name in zip(tools, names):
        check_schema(tool["function"].get("parameters") or {"type": "object"}, f"tools[{name}].parameters")
    import xgrammar as xgr

    eos = gen_config.eos_token_id
    comp = compiler(tokenizer, vocab, eos if isinstance(eos, (list, tuple)) else [eos])
    functions = [{"type": "function", "function": {"name": t["function"]["name"],
                                                   "parameters": t["function"].get("parameters") or {"type": "object"}}}
                 for t in tools]
    # At most one whitespace character between the parts of a call (GLM-4.5 writes a newline,
    # GLM-4.7 none); unbounded whitespace would let a reply pad itself until max_tokens.
    # xgrammar also allows it just inside <arg_value>…</arg_value>: the parser drops it there
    # (`padded`), so the value the client gets is the one the schema constrained.
    tag = xgr.get_model_structural_tag("glm_4_7", tools=functions, tool_choice=choice, reasoning="disabled",
                                       parallel_tool_calls=parallel, max_whitespace_cnt=1)
    try:
        if thinking.on() and choice != "auto":  # 0150: no padding in values, no text after the calls
            ids = [tokenizer.convert_tokens_to_ids(t) for t in (thinking.TOOL_CALL, thinking.END_TOOL_CALL)]
            markers = None if tokenizer.unk_token_id in ids or None in ids else ids
            compiled = thinking.compile_tool_tag(comp, tag, parallel, markers)
        else:
            compiled = comp.compile_structural_tag(tag)
    except Exception as e:
        raise knobs.PBRequestError(400, f"the tools' schemas could not be compiled: {str(e).splitlines()[-1][:300]}",
                                   code="invalid_schema", param="tools") from None
    constraint = Constraint(compiled, tokenizer, vocab, start_phase(tokenizer, input_ids))
    constraint.calls_only = thinking.on() and choice != "auto"  # 0150: the calls, then the end of the turn
    return constraint

"""0640 PB_GRAMMAR_OVERLAP: a step's grammar masks filled together before its first GPU work.

The masks must be the very bits the row-by-row path used: the batched sampler with and
without the knob picks the same tokens on hand-made logits, and through the API constrained
replies (json_schema, tool_choice required under 0150's budget) are the same with the knob on
and off per request, alone and next to other constrained and free requests. Also the
drafting-ready masks (a step and each position after a chain of draft tokens) against the
masks the same tokens get one step at a time, and the compiler's cache by schema.
"""

import concurrent.futures
import json

import httpx
import pytest
import torch


pytestmark = pytest.mark.build

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags", "n"],
          "properties": {"name": {"type": "string", "maxLength": 12},
                         "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 3},
                         "n": {"type": "integer", "minimum": 0, "maximum": 999}}}


@pytest.fixture(scope="module")
def compiled(grammar, tok):
    comp = grammar.compiler(tok, len(tok), [tok.eos_token_id])
    return comp, grammar.compile_body(comp, "json", SCHEMA, "response_format")


def constraint(grammar, tok, compiled, phase="body"):
    return grammar.Constraint(compiled[1], tok, len(tok), phase)


def allowed(grammar, c, spec, vocab) -> torch.Tensor:
    """What the row-by-row mask leaves finite at this step."""
    return c(spec, torch.zeros(vocab)) > float("-inf")


def bits(row: torch.Tensor, vocab: int) -> torch.Tensor:
    """A bitmask row [words] int32 -> bool [vocab]."""
    shifts = torch.arange(32, dtype=torch.int32)
    return ((row[:, None] >> shifts) & 1).bool().flatten()[:vocab]


def walk(grammar, tok, compiled, sampler, phase, steps: int, seed: int) -> list[int]:
    """A valid reply of `steps` tokens: at each step a random allowed token (seeded)."""
    g = torch.Generator().manual_seed(seed)
    c, spec = constraint(grammar, tok, compiled, phase), sampler.Spec()
    for _ in range(steps):
        ok = allowed(grammar, c, spec, len(tok)).nonzero().flatten()
        spec.tokens.append(int(ok[torch.randint(len(ok), (1,), generator=g)]))
        if c.matcher.is_terminated():
            break
    return spec.tokens


@pytest.mark.parametrize("phase", ["body", "pre", "think"])
def test_draft_masks_equal_the_masks_of_the_same_tokens_step_by_step(grammar, tok, compiled, sampler, phase):
    vocab = len(tok)
    think_tokens = [tok.convert_tokens_to_ids("<think>")] if phase == "pre" else []
    end = [tok.convert_tokens_to_ids("</think>")] if phase != "body" else []
    thought = tok.encode("a thought", add_special_tokens=False)[:2] if phase != "body" else []
    prefix = think_tokens + thought + end  # thinking first, then the grammar
    reply = prefix + walk(grammar, tok, compiled, sampler, "body", 40, seed=len(phase))
    serial_c, serial_spec, serial = constraint(grammar, tok, compiled, phase), sampler.Spec(), []
    for token in reply:
        serial.append(allowed(grammar, serial_c, serial_spec, vocab))
        serial_spec.tokens.append(token)
    for start in (0, 1, len(prefix), len(prefix) + 7, len(reply) - 6):
        c, spec = constraint(grammar, tok, compiled, phase), sampler.Spec(tokens=list(reply[:start]))
        draft = reply[start:start + 6]
        rows = c.draft_masks(spec, draft)
        assert rows.shape[0] == len(draft) + 1  # every draft token is allowed: a row after each
        for i in range(min(rows.shape[0], len(draft))):
            assert torch.equal(bits(rows[i], vocab), serial[start + i]), (phase, start, i)
        # The state is left where it was: the next step's mask is the serial one.
        assert torch.equal(allowed(grammar, c, spec, vocab), serial[start])


def test_draft_masks_stop_at_a_refused_token(grammar, tok, compiled, sampler):
    vocab = len(tok)
    reply = walk(grammar, tok, compiled, sampler, "body", 20, seed=3)
    assert len(reply) >= 8
    c, spec = constraint(grammar, tok, compiled), sampler.Spec(tokens=reply[:4])
    here = allowed(grammar, constraint(grammar, tok, compiled), sampler.Spec(tokens=reply[:6]), vocab)
    refused = int((~here).nonzero()[0])
    rows = c.draft_masks(spec, [reply[4], reply[5], refused, reply[7]])
    assert rows.shape[0] == 3  # this step, after reply[4], after reply[5]: the refused token ends the draft
    assert not bool(bits(rows[2], vocab)[refused])
    again = c.draft_masks(spec, [reply[4], reply[5]])  # nothing of the refused draft stayed behind
    assert torch.equal(again, rows[:3])


def test_the_compiler_keeps_one_compiled_grammar_per_schema(grammar, tok, compiled):
    comp = compiled[0]
    size = comp.get_cache_size_bytes()
    grammar.compile_body(comp, "json", SCHEMA, "response_format")
    assert comp.get_cache_size_bytes() == size  # the same schema: taken from the cache
    other = {**SCHEMA, "required": ["name"]}
    grammar.compile_body(comp, "json", other, "response_format")
    assert comp.get_cache_size_bytes() > size


def test_the_batched_sampler_picks_the_same_tokens_with_masks_filled_together(grammar, tok, compiled, sampler, bs):
    vocab = len(tok)
    torch.manual_seed(4)

    def rows(on: bool):
        made = []
        for i in range(12):
            s = sampler.Spec(do_sample=i % 3 != 0, temperature=0.9, top_p=0.95, seed=50 + i,
                             logprobs=i % 5 == 1, top_logprobs=2 * (i % 2), presence_penalty=0.5 * (i == 11))
            if i % 4 != 3:  # three of every four rows constrained, each in its own phase
                s.mask = constraint(grammar, tok, compiled, ("body", "pre", "think")[i % 3])
            s.overlap = on
            made.append(s)
        return made

    on, off = rows(True), rows(False)
    filled = 0
    for step in range(25):
        raw = torch.randn(12, vocab)
        a, b = bs.choose_rows(on, raw.clone(), list(range(12))), bs.choose_rows(off, raw.clone(), list(range(12)))
        assert a.tolist() == b.tolist(), step
        filled += sum(s.mask.ready is not None for s in on if s.mask is not None)
        assert all(s.mask.ready is None for s in off if s.mask is not None)
    assert filled >= 25  # the grammar rows' masks came from the batched fill
    bs.catch_up()
    for a, b in zip(on, off):
        assert (a.tokens, a.chosen_logprobs, a.top) == (b.tokens, b.chosen_logprobs, b.top)
    assert sum(len(s.chosen_logprobs) == 25 for s in on) == 3 and len(on[1].top[0]) == 2


# ---- through the API ---------------------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["word", "limit"],
    "properties": {"word": {"type": "string", "maxLength": 10}, "limit": {"type": "integer", "minimum": 1,
                                                                          "maximum": 20}}}}}


def post(server, i: int, knob: int, kind: str) -> dict:
    body = {"model": server.model, "max_tokens": 200, "temperature": 0.8, "top_p": 0.95, "seed": 900 + i,
            "messages": [{"role": "user", "content": f"Request {i}: fill in the record for item {i * 7}."}],
            "pb_knobs": {"PB_GRAMMAR_OVERLAP": knob}}
    if kind == "json":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": SCHEMA}}
    elif kind == "tools":
        body.update(tools=[TOOL], tool_choice="required")
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    for call in choice["message"].get("tool_calls") or []:
        call.pop("id")  # a fresh id for every call
    return choice


KINDS = ["json", "tools", "free", "json", "tools", "json", "free", "tools"]


@pytest.mark.engine
def test_constrained_replies_are_the_same_with_the_masks_filled_together(server_on):
    alone_off = [post(server_on, i, 0, kind) for i, kind in enumerate(KINDS[:3])]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together_on = list(pool.map(lambda a: post(server_on, a[0], 1, a[1]), enumerate(KINDS)))
    assert together_on[:3] == alone_off
    for choice, kind in zip(together_on, KINDS):
        if kind == "json":
            record = json.loads(choice["message"]["content"])
            assert set(record) == {"name", "tags", "n"} and 0 <= record["n"] <= 999
        elif kind == "tools":
            assert choice["finish_reason"] == "tool_calls"
            call = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])
            assert set(call) == {"word", "limit"} and len(call["word"]) <= 10


@pytest.mark.engine
@pytest.mark.parametrize("stream", [False, True])
def test_log_probabilities_arrive_whole_when_tokens_are_read_a_step_later(server_on, stream):
    def chat(knob: int):
        body = {"model": server_on.model, "max_tokens": 24, "temperature": 0.8, "seed": 77, "logprobs": True,
                "top_logprobs": 3, "stream": stream, "ignore_eos": True, "pb_knobs": {"PB_GRAMMAR_OVERLAP": knob},
                "messages": [{"role": "user", "content": "Name three rivers."}]}
        with httpx.stream("POST", f"{server_on.url}/v1/chat/completions", json=body, timeout=300) as r:
            assert r.status_code == 200
            text = r.read().decode()
        if not stream:
            return json.loads(text)["choices"][0]["logprobs"]["content"]
        chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        return [e for c in chunks for ch in c["choices"] for e in (ch.get("logprobs") or {}).get("content") or []]

    def legacy(knob: int):
        body = {"model": server_on.model, "prompt": "def add(a, b):", "max_tokens": 16, "temperature": 0.8,
                "seed": 5, "logprobs": 2, "ignore_eos": True, "pb_knobs": {"PB_GRAMMAR_OVERLAP": knob}}
        r = httpx.post(f"{server_on.url}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["logprobs"]

    # A first send, so that both compared sends resume from its cache the same way (0760 computes a
    # resend's last two prompt rows; a CPU's products round by their row count)
    chat(1)
    on, off = chat(1), chat(0)
    assert len(on) == 24 and on == off
    assert all(len(e["top_logprobs"]) == 3 for e in on)
    if not stream:
        legacy(1)
        on, off = legacy(1), legacy(0)
        assert len(on["token_logprobs"]) == 16 and on == off

"""0800 PB_DRAFT_TOKENS: prompt-lookup drafts verified in continuous batching, replies unchanged.

Drafted == serial is checked on synthetic:trained, which copies what it has read, so its drafts
are kept often; the CPU runs with torch's plain kernels (ATEN_CPU_CAPABILITY=default), whose rows
do not change bits with the number of rows beside them (conftest.INTERPRETER_ENV), as the GPU's
batch-invariant kernels do not."""

from __future__ import annotations

import inspect
import json
import re
import textwrap

import pytest

from .conftest import ALL_ON, INTERPRETER_ENV, Server, engine_jobs, engine_module

PHASES = ("greedy_together", "greedy_alone", "sampled_together", "sampled_alone", "follow_up", "masked_greedy",
          "masked_sampled", "masked_alone", "greedy_staggered")
BACKOFF_PHASES = ("greedy_together", "sampled_together", "masked_sampled")


@pytest.fixture(scope="module")
def draft_runs(patched_engine, trained_model):
    env = {**ALL_ON, **INTERPRETER_ENV}
    # off and on whatever the production set drafts with; on: at any load
    runs = {"off": {"PB_DRAFT_TOKENS": "0"}, "on": {"PB_DRAFT_TOKENS": "8", "PB_DRAFT_STREAMS": "0"},
            "streams": {"PB_DRAFT_TOKENS": "8", "PB_DRAFT_STREAMS": "2",
                        "DRAFT_JOB_PHASES": "greedy_together,greedy_alone,greedy_staggered"},
            "backoff": {"PB_DRAFT_TOKENS": "8", "PB_DRAFT_STREAMS": "0", "PB_DRAFT_BACKOFF": "16",
                        "DRAFT_JOB_PHASES": ",".join(BACKOFF_PHASES)},
            "pays": {"PB_DRAFT_TOKENS": "8", "PB_DRAFT_STREAMS": "0", "PB_DRAFT_BACKOFF": "16", "PB_DRAFT_PAYS": "4",
                     "DRAFT_JOB_PHASES": ",".join(BACKOFF_PHASES)}}
    with engine_jobs("draft_job.py", patched_engine, trained_model, "48", runs=runs, **env) as jobs:
        return tuple(jobs[name].report() for name in ("off", "on", "streams", "backoff", "pays"))


def test_drafted_replies_are_the_serial_replies(draft_runs):
    """Greedy and seeded sampled, three edit prompts together and each alone; a request whose
    prompt extends an earlier reply (it reuses the prefix blocks that reply completed while it
    drafted); requests that think under a 12-token budget and then write JSON under a grammar
    (masked rows, `</think>` forced): every reply with drafts is the reply without, token for
    token."""
    off, on, *_ = draft_runs
    for phase in PHASES:
        assert on[phase] == off[phase], phase
    assert off["greedy_together"] == off["greedy_alone"] and off["sampled_together"] == off["sampled_alone"]
    assert off["masked_sampled"] == off["masked_alone"]
    # three reply lengths together: each reply is the start of the prompt's reply alone
    assert [len(r) for r in off["greedy_staggered"]] == [16, 32, 48]
    assert off["greedy_staggered"] == [off["greedy_alone"][i][:n] for i, n in enumerate((16, 32, 48))]
    assert all(len(reply) == 48 for reply in on["greedy_alone"] + on["sampled_alone"])
    end_think = 3990  # synthetic:trained's `</think>`
    for reply in on["masked_greedy"] + on["masked_sampled"]:
        assert reply.index(end_think) == 12, reply  # the budget's end, forced where the serial reply has it


def test_drafting_keeps_drafts_and_takes_fewer_steps(draft_runs):
    """With the knob, every phase verified drafts and kept some; a lone greedy request took at most
    two thirds of the steps; unset, nothing drafted."""
    off, on, *_ = draft_runs
    for phase in PHASES:
        assert off["counts"][phase]["verify_steps"] == 0, phase
        counts = on["counts"][phase]
        assert counts["verify_steps"] > 0 and 0 < counts["kept"] <= counts["drafted"], (phase, counts)
        assert counts["rows"] > off["counts"][phase]["rows"], (phase, counts)
    assert on["counts"]["greedy_alone"]["steps"] * 3 <= off["counts"]["greedy_alone"]["steps"] * 2, on["counts"]


def test_past_the_stream_limit_nothing_drafts(draft_runs):
    """0820 PB_DRAFT_STREAMS=2: while the scheduler holds three requests nothing drafts (without the
    limit, requests drafted with three held), each prompt alone drafts as without the limit, and
    every reply is the serial one."""
    off, on, streams, *_ = draft_runs
    assert on["counts"]["greedy_together"]["held_when_drafting"] == 3, on["counts"]
    assert streams["counts"]["greedy_together"]["held_when_drafting"] <= 2, streams["counts"]
    assert streams["counts"]["greedy_together"]["verify_steps"] < on["counts"]["greedy_together"]["verify_steps"]
    assert streams["counts"]["greedy_alone"] == on["counts"]["greedy_alone"], streams["counts"]
    for phase in ("greedy_together", "greedy_alone", "greedy_staggered"):
        assert streams[phase] == off[phase], phase
    # three held at first: no drafts until the shortest reply ends and two remain
    assert streams["counts"]["greedy_staggered"]["verify_steps"] > 0
    assert streams["counts"]["greedy_staggered"]["held_when_drafting"] <= 2


def test_only_requests_whose_choice_reads_logits_seed_position_and_mask_draft(patched_engine, grammar, tok):
    """What a request may draft is fixed when it is added, from its own knobs: a request without a
    Spec drafts when the batch's choice is the argmax; a Spec drafts when 0630 samples it or it
    chooses greedily, with a grammar or a thinking budget or none; forced tokens, penalties,
    min_tokens, log-probabilities, tool_choice required's end-of-turn rule, masks of other kinds
    and sampling from a generator never do; PB_DRAFT_TOKENS=0 in a request's knobs turns it off."""
    from types import SimpleNamespace

    knobs = engine_module(patched_engine, "knobs")
    sampler = engine_module(patched_engine, "runtime.sampler")
    drafts = engine_module(patched_engine, "runtime.drafts")
    thinking = engine_module(patched_engine, "api.thinking")
    follower = lambda: grammar.Constraint(None, tok, len(tok), "think")  # noqa: E731

    def admitted(spec, **overrides):
        knobs.use_request_overrides({"PB_DRAFT_TOKENS": 6, "PB_BATCHED_SAMPLER": True, **overrides})
        state = SimpleNamespace(request_id="r")
        try:
            if spec is not None:
                sampler.register("r", spec)
            drafts.admit(state)
        finally:
            sampler.release("r")
            knobs.use_request_overrides(None)
        return getattr(state, "_pb_draft", None)

    assert admitted(None) == (6, True)
    assert admitted(sampler.Spec(do_sample=True, temperature=0.8, top_p=0.9, seed=3)) == (6, False)
    assert admitted(sampler.Spec(logit_bias={5: 2.0})) == (6, False)
    assert admitted(sampler.Spec(), PB_BATCHED_SAMPLER=False) == (6, False)  # plain greedy
    assert admitted(sampler.Spec(mask=follower())) == (6, False)
    assert admitted(sampler.Spec(mask=thinking.Budget(follower, 7, 100, 200), do_sample=True, seed=1)) == (6, False)
    assert admitted(sampler.Spec(mask=follower()), PB_BATCHED_SAMPLER=False) == (6, False)  # greedy
    assert admitted(sampler.Spec(mask=thinking.Budget(follower, 7, 100, 200, stops=[0]))) is None
    for spec in (sampler.Spec(mask=lambda spec, scores: scores), sampler.Spec(forced=[1, 2]),
                 sampler.Spec(logprobs=True), sampler.Spec(presence_penalty=0.5), sampler.Spec(repetition_penalty=1.1),
                 sampler.Spec(min_tokens=3, suppress=(0,))):
        assert admitted(spec) is None, spec
    assert admitted(sampler.Spec(do_sample=True, seed=3), PB_BATCHED_SAMPLER=False) is None
    assert admitted(None, PB_DRAFT_TOKENS=0) is None


def test_a_request_whose_tries_keep_nothing_backs_off(draft_runs):
    """0870 PB_DRAFT_BACKOFF=16: after tries that kept nothing (no match, or every draft rejected)
    a request passes steps without trying; replies stay the serial ones, it tries less often than
    without the knob, and what it keeps a try is at least as much."""
    off, on, _, backoff, _ = draft_runs
    for phase in BACKOFF_PHASES:
        assert backoff[phase] == off[phase], phase
    assert all(on["counts"][phase]["passed"] == 0 for phase in PHASES), on["counts"]
    counts = [backoff["counts"][phase] for phase in BACKOFF_PHASES]
    before = [on["counts"][phase] for phase in BACKOFF_PHASES]
    assert sum(c["passed"] for c in counts) > 0, counts
    assert sum(c["verify_steps"] for c in counts) < sum(c["verify_steps"] for c in before), (counts, before)
    kept = sum(c["kept"] for c in counts) / sum(c["verify_steps"] for c in counts)
    assert kept >= sum(c["kept"] for c in before) / sum(c["verify_steps"] for c in before) * 0.9, (counts, before)


def test_a_try_that_keeps_too_little_is_a_miss(draft_runs):
    """0900 PB_DRAFT_PAYS=4 beside 0870's backoff, through the engine: the replies stay the serial
    ones (only when a request tries changes), and requests still draft."""
    off, _, _, _, pays = draft_runs
    for phase in BACKOFF_PHASES:
        assert pays[phase] == off[phase], phase
    assert sum(pays["counts"][phase]["kept"] for phase in BACKOFF_PHASES) > 0, pays["counts"]


def test_a_try_pays_when_it_keeps_enough_or_every_draft_it_had(patched_engine):
    """0900's rule on a request's walk: with PB_DRAFT_PAYS=3 a try that keeps fewer than three
    drafts is a miss (0870 then passes 2, 4, ... steps), unless it kept every draft it had; one that
    keeps three ends the backoff. Unset (0870's rule), keeping one ends it."""
    knobs = engine_module(patched_engine, "knobs")
    drafts = engine_module(patched_engine, "runtime.drafts")

    def walk(environ, tries):
        knobs.load(environ)
        w = drafts._Walk(8)
        seen = []
        for kept, drafted in tries:
            w.tried(kept, drafted)
            seen.append((w.misses, w.skip))
        return seen

    try:
        tries = [(0, 0), (1, 3), (2, 5), (2, 2), (1, 4), (3, 5)]
        assert walk({"PB_DRAFT_BACKOFF": "16", "PB_DRAFT_PAYS": "3"}, tries) == [
            (1, 2), (2, 4), (3, 8), (0, 0), (1, 2), (0, 0)]
        assert walk({"PB_DRAFT_BACKOFF": "16"}, tries) == [(1, 2), (0, 0), (0, 0), (0, 0), (0, 0), (0, 0)]
        assert walk({"PB_DRAFT_BACKOFF": "4", "PB_DRAFT_PAYS": "3"}, tries[:3]) == [(1, 2), (2, 4), (3, 4)]
        assert walk({"PB_DRAFT_PAYS": "3"}, tries[:2]) == [(0, 0), (0, 0)]  # no backoff: every step tries
    finally:
        knobs.load({})


def test_only_a_synchronous_processor_drafts_unless_0860(patched_engine):
    """A drafting step needs the last step's tokens before it is prepared: a processor batching
    asynchronously (0240) gets no drafting, a synchronous one does, on any device. With 0860
    (PB_DRAFT_ASYNC) an asynchronous one drafts too, its first step taken to be in flight (so
    nothing drafts until the loop waited for one); a server that drafts then keeps 0240's choice
    instead of batching synchronously. (The loop itself runs on a GPU: test_drafts_gpu.py.)"""
    from types import SimpleNamespace

    import torch

    knobs = engine_module(patched_engine, "knobs")
    drafts = engine_module(patched_engine, "runtime.drafts")

    def attached(device: str, sync: bool):
        processor = SimpleNamespace(use_async_batching=not sync, model_device=torch.device(device),
                                    scheduler=SimpleNamespace(), do_sample=False, return_logprobs=False,
                                    logit_processor=SimpleNamespace(do_processing=False))
        drafts.attach(processor)
        return processor.scheduler._pb_drafting

    def decided(**overrides):
        knobs.use_request_overrides(overrides)
        try:
            cb_config = SimpleNamespace(use_async_batching=None)
            drafts.decide(cb_config)
            return cb_config.use_async_batching
        finally:
            knobs.use_request_overrides(None)

    assert attached("cpu", sync=True) is not None and attached("cpu", sync=False) is None
    assert attached("cuda", sync=True) is not None and attached("cuda", sync=False) is None
    assert decided(PB_DRAFT_TOKENS=8) is False and decided() is None
    knobs.use_request_overrides({"PB_DRAFT_ASYNC": True})
    try:
        loop = attached("cuda", sync=False)
        plain = attached("cuda", sync=True)
    finally:
        knobs.use_request_overrides(None)
    assert loop.asynchronous and loop.in_flight and not plain.asynchronous and not plain.in_flight
    assert decided(PB_DRAFT_TOKENS=8, PB_DRAFT_ASYNC=True) is None


def test_a_verify_step_reads_each_rows_prefix(patched_engine):
    """The scheduler's cache budget for a drafting step counts each row's own prefix: past,
    past + 1, ..., past + drafts; a batch hinted at n requests gets rows for their drafts."""
    from types import SimpleNamespace

    knobs = engine_module(patched_engine, "knobs")
    drafts = engine_module(patched_engine, "runtime.drafts")
    assert drafts.read_needed(100, 0) == 100 and drafts.read_needed(100, 3) == 100 + 101 + 102 + 103
    state = SimpleNamespace(_pb_drafts=(7, 8))
    assert drafts.cache_read(state, 50) == 50 + 51 + 52 and drafts.rows(state) == 3
    assert drafts.complete_blocks(state, {"full_attention": 1}) == {}
    plain = SimpleNamespace()
    assert drafts.cache_read(plain, 50) == 50 and drafts.rows(plain) == 1
    assert drafts.complete_blocks(plain, {"full_attention": 1}) == {"full_attention": 1}
    knobs.use_request_overrides({"PB_DRAFT_TOKENS": 8})
    try:
        assert drafts.rows_for(3, 1024) == 27 and drafts.rows_for(200, 1024) == 1024
    finally:
        knobs.use_request_overrides(None)
    assert drafts.rows_for(3, 1024) == 3  # the knob unset: upstream's hint


EDIT = ("Here is a file of our repository. Add type hints where they are missing and fix anything you think is "
        "a bug. Reply with the whole edited file.\n\n")


@pytest.fixture(scope="module")
def drafting_server(patched_engine, trained_model, tmp_path_factory):
    """synthetic:trained served with every adopted knob and PB_DRAFT_TOKENS=8."""
    with pytest.MonkeyPatch.context() as mp:
        for name, value in INTERPRETER_ENV.items():
            mp.setenv(name, value)
        server = Server(patched_engine, trained_model, {**ALL_ON, "PB_DRAFT_TOKENS": "8"},
                        tmp_path_factory.mktemp("run-drafts"))
    yield server
    server.stop()


def test_a_server_drafts_and_replies_as_without_drafts(drafting_server):
    """Through the API: an edit request, greedy and seeded sampled, streamed and not, thinking
    (under 0150's budget) and not, replies the same with drafts and with `pb_knobs` turning them
    off; /metrics counts the drafted and kept tokens."""
    import httpx

    source = EDIT + textwrap.dedent(inspect.getsource(textwrap.dedent))
    url = drafting_server.url

    def reply(stream: bool, drafts: bool, **sampling) -> str:
        body = {"messages": [{"role": "user", "content": source}], "max_tokens": 64, "ignore_eos": True,
                **sampling}
        if not drafts:
            body["pb_knobs"] = {"PB_DRAFT_TOKENS": 0}
        if not stream:
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
            assert r.status_code == 200, r.text
            message = r.json()["choices"][0]["message"]
            return (message.get("reasoning_content") or "") + "|" + (message["content"] or "")
        reasoning, text = [], []
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    for choice in json.loads(line[6:]).get("choices", []):
                        delta = choice.get("delta", {})
                        reasoning.append(delta.get("reasoning_content") or "")
                        text.append(delta.get("content") or "")
        return "".join(reasoning) + "|" + "".join(text)

    def drafted_tokens() -> tuple[float, float]:
        metrics = httpx.get(f"{url}/metrics", timeout=30).text
        found = {name: float(value) for name, value in
                 re.findall(r"^(pb_draft_(?:drafted|accepted)_total) (\S+)$", metrics, re.M)}
        return found.get("pb_draft_drafted_total", -1.0), found.get("pb_draft_accepted_total", -1.0)

    assert drafted_tokens() == (0.0, 0.0)
    no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}
    for sampling in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 11},
                     {"temperature": 0, **no_thinking}, {"temperature": 0.8, "top_p": 0.95, "seed": 12, **no_thinking}):
        plain = reply(False, False, **sampling)
        before = drafted_tokens()
        assert reply(False, True, **sampling) == plain, sampling
        assert reply(True, True, **sampling) == plain, sampling
        after = drafted_tokens()
        assert after[0] > before[0] and after[1] > before[1], (before, after)
        assert reply(False, False, **sampling) == plain
        assert drafted_tokens() == after  # the knob off for the request: nothing drafted

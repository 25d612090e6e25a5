"""The prompt-lookup drafter walked along serial replies (measure/draft.py)."""

import random

import pytest

from patchbay.measure import draft
from patchbay.measure.draft import Lookup, replay
from patchbay.runtime.synth import air12_config


def brute_propose(ids, k, longest, shortest):
    """The latest earlier occurrence of the longest suffix n-gram, searched the slow way."""
    for n in range(min(longest, len(ids)), shortest - 1, -1):
        gram = ids[len(ids) - n:]
        for end in range(len(ids) - 1, n - 1, -1):
            if ids[end - n:end] == gram:
                return ids[end:end + k]
    return []


@pytest.mark.parametrize("longest,shortest", [(4, 2), (3, 1), (1, 1)])
def test_lookup_proposes_what_a_search_finds_at_every_length(longest, shortest):
    rng = random.Random(longest * 10 + shortest)
    ids = [rng.randrange(6) for _ in range(300)]
    look = Lookup([], longest, shortest)
    for i, token in enumerate(ids):
        for k in (1, 3, 8):
            assert look.propose(k) == brute_propose(ids[:i], k, longest, shortest), (i, k)
        look.extend([token])


@pytest.mark.parametrize("longest,shortest", [(4, 2), (3, 1)])
def test_lookup_filed_in_slices_proposes_what_it_proposes_filed_token_by_token(longest, shortest):
    """The engine files a long prompt a slice a step (0800): any cut gives the same proposals."""
    rng = random.Random(longest)
    ids = [rng.randrange(5) for _ in range(400)]
    look, at = Lookup([], longest, shortest), 0
    while at < len(ids):
        step = rng.randrange(1, 40)
        look.extend(ids[at:at + step])
        at = min(at + step, len(ids))
        for k in (1, 4, 8):
            assert look.propose(k) == brute_propose(ids[:at], k, longest, shortest), (at, k)


def test_lookup_prefers_the_longest_and_latest_match():
    look = Lookup([1, 2, 3, 9, 2, 3, 7, 8, 1, 2, 3], longest=3, shortest=1)
    assert look.propose(2) == [9, 2]  # 1 2 3 occurred once before, followed by 9
    look = Lookup([5, 3, 7, 4, 3, 8, 6, 3], longest=3, shortest=1)
    assert look.propose(3) == [8, 6, 3]  # only 3 matches; its latest earlier occurrence is followed by 8
    assert Lookup([1, 2, 3, 4], 3, 1).propose(4) == []
    with pytest.raises(ValueError):
        Lookup([], 2, 3)


def test_replay_of_a_reply_that_copies_its_prompt_keeps_whole_drafts():
    text = list(range(100, 160))
    prompt = [1, 2] + text + [3]
    reply = text[:40]
    # the first step has nothing to match (the prompt ends in 3); then every draft of 4 agrees
    run = replay(prompt, reply, 4, longest=2, shortest=1)
    assert run.tokens == 40 and run.accepted == run.tokens - run.steps
    assert run.steps == 1 + 39 // 5 + (1 if 39 % 5 else 0)
    assert run.tokens_per_step > 4
    assert run.from_reply == 0  # every kept token was copied from the prompt


def test_replay_names_tokens_kept_from_a_loop_in_the_reply_itself():
    run = replay([1, 2, 3], [7, 8, 9] * 10, 4, 2, 1)
    assert run.accepted > 15 and run.from_reply == run.accepted


def test_replay_without_drafts_takes_a_step_a_token_and_never_keeps_more_than_the_reply():
    rng = random.Random(7)
    prompt = [rng.randrange(20) for _ in range(200)]
    reply = [rng.randrange(20) for _ in range(150)]
    plain = replay(prompt, reply, 0)
    assert (plain.steps, plain.drafted, plain.accepted) == (150, 0, 0)
    for k in (1, 2, 8):
        run = replay(prompt, reply, k, 3, 1)
        assert run.accepted + run.steps == run.tokens == 150  # each step's own token, plus what it kept
        assert run.accepted <= run.drafted <= k * run.steps


def test_bytes_speedup_charges_a_verify_step_the_experts_its_tokens_route_to():
    config = air12_config()
    one = replay([1, 2, 3] * 30, [1, 2, 3] * 10, 1, 2, 1)
    assert draft.bytes_speedup([replay([9], [5, 6, 7], 4)], config) == pytest.approx(1.0)  # nothing drafted
    # every step drafted one token and kept it: two tokens for the bytes of a two-sequence step
    from patchbay.measure.roofline import step_params
    assert one.accepted == one.drafted
    expected = one.tokens * step_params(config, 1) / (one.steps * step_params(config, 2))
    assert draft.bytes_speedup([one], config) == pytest.approx(expected)
    assert 1.0 < draft.bytes_speedup([one], config) < 2.0


def test_summarize_rows_cover_every_kind_mode_length_and_ngram_range():
    records = [{"kind": "edit", "mode": "greedy", "prompt": [1, 2, 3, 4] * 20, "reply": [1, 2, 3, 4] * 5},
               {"kind": "prose", "mode": "sampled", "prompt": [5, 6, 7], "reply": [8, 9, 10]}]
    rows = draft.summarize(records)
    assert len(rows) == 2 * len(draft.NGRAMS) * (len(draft.DRAFT_LENGTHS) + 1)
    edit = [r for r in rows if r["kind"] == "edit" and r["ngrams"] == "4..2"]
    assert [r["k"] for r in edit] == [*draft.DRAFT_LENGTHS, "<=8 adaptive"]
    assert edit[-2]["tokens_per_step"] > edit[0]["tokens_per_step"] > 1.0
    prose = [r for r in rows if r["kind"] == "prose"]
    assert all(r["drafted"] == 0 and r["tokens_per_step"] == 1.0 for r in prose)
    assert "| edit | greedy | 4..2 | 8 |" in draft.render(rows)


def test_adaptive_drafts_shrink_where_they_miss_and_grow_back_where_they_agree():
    rng = random.Random(3)
    prompt = [rng.randrange(8) for _ in range(400)]
    reply = [rng.randrange(8) for _ in range(300)]  # matches everywhere, mostly wrong guesses
    fixed, adaptive = replay(prompt, reply, 8, 2, 1), replay(prompt, reply, 8, 2, 1, adaptive=True)
    assert adaptive.drafted < fixed.drafted / 2
    assert adaptive.accepted + adaptive.steps == adaptive.tokens == 300
    assert max(adaptive.step_drafts) <= 8
    text = list(range(100, 200))
    copying = replay([1] + text + [2], text[:90], 8, 2, 1, adaptive=True)
    assert copying.step_drafts[-3] == 8  # a run of agreeing drafts regrows the draft to its longest

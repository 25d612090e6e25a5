"""0630 PB_BATCHED_SAMPLER: the step's rows chosen together, with draws keyed by (seed, position).

The module's own functions on hand-made logits (its draws follow the distribution the settings
leave, a row's token never depends on its neighbours), then the live engine: seeded sampled
replies alone and next to 31 others are the same, and greedy replies keep their bits.
"""

import concurrent.futures
import copy
import math

import pytest
import torch

from .conftest import sampled_reply

pytestmark = pytest.mark.build


def spec(sampler, **settings):
    s = sampler.Spec(do_sample=True, **settings)
    s.seed = settings.get("seed", 1)
    return s


def test_the_hash_is_a_32_bit_counter_generator(bs):
    keys = {bs.row_key(seed, pos) for seed in (0, 1, 2**40 + 3) for pos in range(200)}
    assert len(keys) == 600 and all(0 <= k < 2**32 for k in keys)
    e = bs.exponentials(torch.tensor([[bs.row_key(7, 0)]]), torch.arange(200_000)[None, :])
    assert e.shape == (1, 200_000) and bool((e > 0).all())
    assert abs(float(e.mean()) - 1.0) < 0.01 and abs(float(e.var()) - 1.0) < 0.03  # Exp(1): mean 1, var 1
    again = bs.exponentials(torch.tensor([[bs.row_key(7, 0)]]), torch.arange(200_000)[None, :])
    assert torch.equal(e, again)


def test_draws_follow_the_distribution_the_settings_leave(bs, sampler):
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    counts = torch.zeros(6)
    rows = [spec(sampler, seed=s, temperature=0.8) for s in range(4000)]
    picks = bs.choose_rows(rows, logits.expand(4000, 6).clone(), list(range(4000)))
    counts = torch.bincount(picks, minlength=6).float()
    expected = torch.softmax(logits / 0.8, dim=-1) * 4000
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, (counts, expected)  # 5 degrees of freedom: p ~ 0.001
    top_k = bs.choose_rows([spec(sampler, seed=s, top_k=2) for s in range(500)], logits.expand(500, 6).clone(),
                           list(range(500)))
    assert set(top_k.tolist()) == {0, 1}
    top_p = bs.choose_rows([spec(sampler, seed=s, top_p=0.5) for s in range(500)], logits.expand(500, 6).clone(),
                           list(range(500)))
    assert set(top_p.tolist()) == {0}  # softmax(2, 1, …): the first token alone holds over half
    min_p = bs.choose_rows([spec(sampler, seed=s, min_p=0.3) for s in range(500)], logits.expand(500, 6).clone(),
                           list(range(500)))
    assert set(min_p.tolist()) == {0, 1}  # e**-1 of the top is over 0.3 of it; e**-1.5 is not


def test_a_row_alone_or_among_31_others_gets_the_same_token(bs, sampler):
    torch.manual_seed(0)
    raw = torch.randn(32, 5000)
    def settings(i):  # every fourth row cuts nothing: it takes the path without a sort
        if i % 4 == 3:
            return dict(seed=100 + i, temperature=0.9)
        return dict(seed=100 + i, temperature=0.7, top_p=0.95, top_k=50 * (i % 3), min_p=0.02 * (i % 2))

    together = bs.choose_rows([spec(sampler, **settings(i)) for i in range(32)], raw.clone(), list(range(32)))
    alone = [int(bs.choose_rows([spec(sampler, **settings(i))], raw[i:i + 1].clone(), [0])) for i in range(32)]
    assert together.tolist() == alone
    shuffled = list(reversed(range(32)))
    backwards = bs.choose_rows([spec(sampler, **settings(i)) for i in shuffled], raw.clone(), shuffled)
    assert backwards.tolist() == [alone[i] for i in shuffled]


def test_greedy_rows_with_processing_match_the_row_by_row_choice(bs, sampler):
    torch.manual_seed(1)
    raw = torch.randn(4, 300)
    made = [dict(logit_bias={5: 3.0}), dict(presence_penalty=1.0, frequency_penalty=0.5, tokens=[1, 1, 2]),
            dict(repetition_penalty=1.3, prompt_ids=[0, 3, 4]), dict(min_tokens=2, suppress=(7,))]
    rows = [sampler.Spec(**copy.deepcopy(m)) for m in made]
    picks = bs.choose_rows(rows, raw.clone(), [0, 1, 2, 3])
    reference = [sampler.choose(sampler.Spec(**copy.deepcopy(m)), raw[i].clone()) for i, m in enumerate(made)]
    assert picks.tolist() == reference
    assert [len(r.tokens) for r in rows] == [0, 4, 1, 1]  # rows whose later steps read their tokens got them


def test_logprobs_are_the_models_own(bs, sampler):
    torch.manual_seed(2)
    raw = torch.randn(2, 100)
    rows = [spec(sampler, seed=3, logprobs=True, top_logprobs=3), spec(sampler, seed=4)]
    picks = bs.choose_rows(rows, raw.clone(), [0, 1])
    lp = torch.log_softmax(raw[0], dim=-1)
    assert rows[0].tokens == [int(picks[0])]
    assert math.isclose(rows[0].chosen_logprobs[0], float(lp[picks[0]]), rel_tol=1e-5)
    assert [t for t, _ in rows[0].top[0]] == lp.topk(3).indices.tolist()
    assert rows[1].tokens == [] and rows[1].position == 1  # a plain sampled row: no wait for its token


@pytest.mark.engine
def test_seeded_replies_alone_equal_replies_batched_with_31_others(batched_server, server_on):
    alone = [sampled_reply(batched_server, i, seed=1000 + i) for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        jobs = [pool.submit(sampled_reply, batched_server, i % 4, 1000 + i % 4 if i < 4 else None) for i in range(32)]
        together = [j.result() for j in jobs]
    assert together[:4] == alone
    assert len(set(together[4:])) > 20  # unseeded requests draw their own seeds
    assert sampled_reply(batched_server, 0, None, temperature=0) == sampled_reply(server_on, 0, None, temperature=0)
    assert alone[0] == sampled_reply(batched_server, 0, seed=1000)  # replayable


def test_uniforms_stay_inside_the_open_interval_at_the_extremes(bs):
    h = torch.tensor([0, 1, 2**23 - 1, 2**31, 2**32 - 2, 2**32 - 1])
    u = bs.uniform(h)
    assert bool((u > 0).all()) and bool((u < 1).all())
    e = -torch.log(u)
    assert bool(torch.isfinite(e).all()) and bool((e > 0).all())  # an E of 0 let a zero-probability token win


def test_a_masked_row_never_gets_a_token_of_probability_zero(bs, sampler):
    torch.manual_seed(3)
    allowed = torch.tensor([5, 17, 900])

    def mask(spec, scores):
        keep = scores[allowed].clone()
        scores.fill_(float("-inf"))
        scores[allowed] = keep
        return scores

    rows = [spec(sampler, seed=s, temperature=1.0, top_p=0.9 if s % 2 else 1.0) for s in range(300)]
    for r in rows:
        r.mask = mask
    picks = bs.choose_rows(rows, torch.randn(300, 151_552), list(range(300)))
    assert set(picks.tolist()) <= {5, 17, 900}

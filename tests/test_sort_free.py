"""0660 PB_SORT_FREE: top-p and min-p drawn without sorting the vocabulary.

The torch version on this CPU: its draws follow the distribution the cuts leave, never leave
the kept set the sort finds, and are the sort's own draws (the same noise over the same set); a row's token is the same alone and next to 31 others taking every
way through the draw. The Triton kernel under Triton's CPU interpreter: the torch version's
tokens, alone and batched, on rows with ties, masks, one allowed token, flat rows and rows with
nothing allowed (which end instead of looping). Through the API, with the knob per request:
seeded replies alone == next to 31 others, replayable, and the knob-off replies.
"""

import concurrent.futures

import pytest
import torch

from .conftest import engine_job, sampled_reply

pytestmark = pytest.mark.build


def spec(sampler, sort_free=True, **settings):
    s = sampler.Spec(do_sample=True, **settings)
    s.seed = settings.get("seed", 1)
    s.sort_free = sort_free
    return s


def kept_by_sort(logits: torch.Tensor, top_p: float, min_p: float) -> set:
    """The tokens top-p and min-p keep, from their definition: the ranking, the mass before each."""
    probs = torch.softmax(logits, dim=-1)
    order = sorted(range(len(logits)), key=lambda t: (-float(logits[t]), t))
    kept, before = set(), 0.0
    for rank, t in enumerate(order):
        if rank > 0 and (before >= top_p or float(probs[t]) < min_p * float(probs[order[0]])):
            break
        kept.add(t)
        before += float(probs[t])
    return kept


def draws(bs, sampler, logits, n, **settings):
    rows = [spec(sampler, seed=s, **settings) for s in range(n)]
    return bs.choose_rows(rows, logits.expand(n, -1).clone(), list(range(n)))


def test_draws_follow_the_distribution_the_cuts_leave(bs, sampler):
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0])
    kept = kept_by_sort(logits, 0.9, 0.0)
    assert kept == {0, 1, 2, 3}  # 0.88 of the mass lies before the fourth
    picks = draws(bs, sampler, logits, 5000, top_p=0.9)
    counts = torch.bincount(picks, minlength=7).float()
    assert counts[4:].sum() == 0
    expected = torch.softmax(logits[:4], dim=-1) * 5000
    chi2 = float(((counts[:4] - expected) ** 2 / expected).sum())
    assert chi2 < 16.3, (counts, expected)  # 3 degrees of freedom: p ~ 0.001
    uncut = torch.bincount(draws(bs, sampler, logits, 5000, temperature=0.8), minlength=7).float()
    expected = torch.softmax(logits / 0.8, dim=-1) * 5000
    assert float(((uncut - expected) ** 2 / expected).sum()) < 22.5  # 6 degrees of freedom
    assert set(draws(bs, sampler, logits, 500, min_p=0.5).tolist()) == {0, 1}  # e**-0.5 of the top; e**-1 not


def test_draws_never_leave_the_set_the_sort_keeps_and_are_the_sorts_draws(bs, sampler):
    torch.manual_seed(4)
    for i in range(6):
        logits = torch.randn(40) * 2
        logits[::7] = torch.round(logits[::7])  # some ties
        top_p, min_p = (0.95, 0.8, 0.5)[i % 3], (0.0, 0.05)[i % 2]
        kept = kept_by_sort(logits, top_p, min_p)
        picks = draws(bs, sampler, logits, 3000, top_p=top_p, min_p=min_p)
        drawn = set(picks.tolist())
        assert drawn <= kept
        # the sort races with the same noise over the same set: the same tokens, but for a rounding
        assert torch.equal(picks, draws(bs, sampler, logits, 3000, top_p=top_p, min_p=min_p, sort_free=False))
        probs = torch.softmax(logits, dim=-1)
        likely = {t for t in kept if float(probs[t]) / sum(float(probs[k]) for k in kept) > 0.01}
        assert likely <= drawn  # every token of the kept set above 1 % came up in 3000 draws


def test_a_row_alone_or_among_31_others_gets_the_same_token_whichever_way_it_draws(bs, sampler):
    torch.manual_seed(5)
    raw = torch.randn(32, 5000) * 2

    def settings(i):  # free rows with and without cuts, sorted rows (top_k, or the knob off), whole rows
        cut = dict(temperature=0.7, top_p=0.95, min_p=0.02 * (i % 2))
        return [dict(cut), dict(temperature=0.9), dict(cut, top_k=40), dict(cut, sort_free=False),
                dict(temperature=0.9, sort_free=False)][i % 5] | dict(seed=300 + i)

    assert {bs.path(spec(sampler, **settings(i)), 5000) for i in range(5)} == {"free", "sorted", "whole"}
    together = bs.choose_rows([spec(sampler, **settings(i)) for i in range(32)], raw.clone(), list(range(32)))
    alone = [int(bs.choose_rows([spec(sampler, **settings(i))], raw[i:i + 1].clone(), [0])) for i in range(32)]
    assert together.tolist() == alone
    free_only = [int(bs.choose_rows([spec(sampler, **settings(i))], raw[i:i + 1].clone(), [0])) for i in range(0, 32, 5)]
    assert free_only == alone[::5]


def test_every_mix_of_ways_is_a_kind_the_graphs_capture(bs):
    assert len(bs.KINDS) == 7 and len(set(bs.KINDS)) == 7
    assert all(k.split("+") == [p for p in bs.PATHS if p in k.split("+")] for k in bs.KINDS)


@pytest.fixture(scope="module")
def kernel_report(patched_engine):
    return engine_job("sort_free_job.py", patched_engine, TRITON_INTERPRET="1")


def test_the_kernel_draws_the_torch_versions_tokens_alone_and_batched(kernel_report):
    cases = kernel_report["cases"]
    assert len(cases) == 3 * 20  # 12 rows of normal logits and 8 of the others, 3 sets of keys
    for case in cases:
        if case["row"] != "nothing-allowed":  # any token will do there: the point is that it ends
            assert case["kernel"] == case["reference"], case
        assert case["kernel"] == case["alone"], case
    for case in cases:
        if case["row"] == "one-token":
            assert case["kernel"] == kernel_report["one_token"]
        if case["row"] == "flat-tiny-top-p":
            assert case["kernel"] == 0  # all tie: the first id ranks first and alone is kept
        if case["row"] == "peaked":
            assert case["kernel"] in (0, 1)
    assert len({c["kernel"] for c in cases if c["row"].startswith("normal")}) > 20
    assert kernel_report["small_equal"] == [True] * 20  # a 21-token row: most of its parts are empty


def _reply(server, i: int, seed: int | None, knob: int = 1) -> str:
    return sampled_reply(server, i, seed, top_p=0.9, min_p=0.01, pb_knobs={"PB_SORT_FREE": knob})


@pytest.mark.engine
def test_seeded_replies_with_the_knob_alone_equal_replies_batched_with_31_others(batched_server):
    alone = [_reply(batched_server, i, seed=2000 + i) for i in range(4)]
    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        jobs = [pool.submit(_reply, batched_server, i % 4, 2000 + i % 4 if i < 4 else None, i % 2) for i in range(32)]
        together = [j.result() for j in jobs]
    assert together[:4] == alone
    assert len(set(together[4:])) > 20
    assert alone[1] == _reply(batched_server, 1, seed=2001)  # replayable
    # the sort's draw races with the same noise over the same kept set: the same replies
    assert alone == [_reply(batched_server, i, seed=2000 + i, knob=0) for i in range(4)]

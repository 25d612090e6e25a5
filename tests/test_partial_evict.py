"""0780 PB_PARTIAL_EVICT: under memory pressure the least recently used cached blocks go back
to the pool, only as many as are needed, where upstream evicts every cached block.

A pool of 24 blocks: three prompts of four to six blocks leave their blocks cached, then a
prompt of about nine blocks needs room. With the knob on the oldest prompt's blocks go and the
most recent one's are found again; with it off every cached block went. The replies are the
same either way.
"""

import argparse

import pytest

from patchbay.runtime.models import model_path

from .conftest import ALL_ON, LOCAL, Server
from .test_prefix_reuse import ask, prompt_ids

pytestmark = pytest.mark.engine

TEXT = open(argparse.__file__).read()


def pressure_prompts(label: str) -> tuple[list[str], str]:
    """Three prompts of four to six blocks and a long one of about nine (the tiny tokenizer), each
    opened by `label` so no other test's blocks match them: together more than a 24-block pool."""
    prompts = [f"{label} {i}.\n{TEXT[6000 * i:6000 * i + 5400]}" for i in range(3)]
    return prompts, f"{label} (long).\n{TEXT[20000:29000]}"


@pytest.fixture(scope="module")
def replies(patched_engine, tmp_path_factory):
    """For the knob off and on: the three prompts' replies, the long one's, then the cached
    counts (and replies) of the third prompt and of the first, sent again in that order."""
    got = {}
    for knob in ("0", "1"):
        # without 0790's host tier, which would bring evicted blocks back and hide what went
        knobs = {**ALL_ON, "PB_PARTIAL_EVICT": knob, "PB_HOST_TIER_MB": "0"}
        s = Server(patched_engine, model_path(LOCAL), knobs, tmp_path_factory.mktemp(f"run-evict-{knob}"),
                   engine_args="--cb-num-blocks 24 --cb-max-batch-tokens 1024")
        try:
            prompts, long = pressure_prompts("Eviction")
            lengths = [len(prompt_ids(s, p)) for p in [*prompts, long]]
            first = [ask(s, p, max_tokens=4) for p in [*prompts, long]]
            third, first_again = ask(s, prompts[2], max_tokens=4), ask(s, prompts[0], max_tokens=4)
            got[knob] = {"lengths": lengths, "first": first, "third": third, "first_again": first_again}
        finally:
            s.stop()
    return got


def test_the_prompts_need_more_than_the_pool(replies):
    lengths = replies["1"]["lengths"]
    assert all(4 * 256 <= n < 6 * 256 for n in lengths[:3]) and 8 * 256 < lengths[3] < 10 * 256, lengths
    assert sum(n // 256 + 1 for n in lengths) > 24 * 0.85  # their blocks cannot all stay


def test_the_oldest_go_and_the_recent_stay_with_the_knob_on(replies):
    on = replies["1"]
    assert on["third"][2] >= on["lengths"][2] // 256 * 256  # the most recent short prompt's blocks were kept
    assert on["first_again"][2] == 0  # the first, least recently used, went


def test_upstream_evicts_every_cached_block(replies):
    off = replies["0"]
    assert off["third"][2] == 0  # the long prompt's room cost the third its blocks too


def test_replies_are_the_same_either_way(replies):
    assert [r[0] for r in replies["0"]["first"]] == [r[0] for r in replies["1"]["first"]]
    assert replies["0"]["third"][0] == replies["1"]["third"][0]
    assert replies["0"]["first_again"][0] == replies["1"]["first_again"][0]

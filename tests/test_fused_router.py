"""The fused expert choice of patch 0280 (PB_FUSED_ROUTER) against upstream's router.

Triton runs through its CPU interpreter in a fresh interpreter process: GLM-4.5-Air's shape
(128 experts, top 8), the tiny model's, experts not a power of two, groups that keep every
expert, one token and no tokens; a group step that drops experts stays upstream's; and the
tiny model's greedy reply with the knob on.
"""

import pytest

from .conftest import engine_job

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def report(patched_engine, tiny_model):
    return engine_job("fused_router_job.py", patched_engine, tiny_model, TRITON_INTERPRET="1", PB_FUSED_ROUTER="1")


def test_the_knob_replaces_the_routers_forward_at_load_only_when_on(report):
    assert report["off_keeps_upstream"] and report["on_installs"]


def test_the_kernel_picks_upstreams_experts_with_their_weights(report):
    for row in report["rows"]:
        assert row["fits"], row
        assert row["same_experts"] and row["max_weight_diff"] < 1e-6, row
        assert row["descending"] and row["logits_equal"], row
    assert [r["shape_out"] for r in report["rows"]][-1] == [0, 8]  # no tokens: empty outputs


def test_a_group_step_that_drops_experts_stays_upstreams(report):
    assert report["dropping_groups"] == {"fits": False, "equal": True}


def test_the_tiny_models_greedy_reply_is_unchanged(report):
    assert report["tiny_greedy_equal"] and report["tiny_new_tokens"] == 24

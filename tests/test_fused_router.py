"""The fused expert choice of patch 0280 (PB_FUSED_ROUTER) against upstream's router.

Triton runs through its CPU interpreter in a fresh interpreter process: GLM-4.5-Air's shape
(128 experts, top 8), the tiny model's, experts not a power of two, groups that keep every
expert, one token and no tokens; a group step that drops experts stays upstream's; and the
tiny model's greedy reply with the knob on.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def report(patched_engine, tiny_model):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}
    env.update(TRITON_INTERPRET="1", PB_FUSED_ROUTER="1", PYTHONPATH=str(patched_engine.site))
    job = Path(__file__).with_name("fused_router_job.py")
    proc = subprocess.run([sys.executable, str(job), tiny_model], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


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

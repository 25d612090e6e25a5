"""The fused MoE forward of patch 0220 (PB_FUSED_MOE) against upstream's eager experts.

Triton runs here through its CPU interpreter, in a fresh interpreter process (the choice
must be made before triton is imported): the same kernels that run on the GPU, checked
on odd shapes, an expert nobody chose, a masked pair, more pairs per expert than a block,
and the whole tiny model (greedy ids equal, teacher-forced |Δ logprob| at float rounding).
"""

import pytest

from .conftest import engine_job

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def report(patched_engine, tiny_model):
    return engine_job("fused_moe_job.py", patched_engine, tiny_model, TRITON_INTERPRET="1")


def test_kernels_match_eager_experts(report):
    assert len(report["kernel"]) == 6
    for case in report["kernel"]:
        assert case["max_abs"] < 1e-5 * max(1.0, case["ref_max"]), case


def test_the_sort_into_blocks_is_one_program_equal_to_the_torch_ops(report):
    assert len(report["align"]) == 12
    assert sum(t * k > 256 for t, _, k, _ in (case["shape"] for case in report["align"])) == 4  # two launches
    for case in report["align"]:
        assert case["equal"] and case["bound"] and case["placed_once"], case
        assert case["stable_equal"], case  # 0450's fixed launch key: the same rows and blocks
        assert case["used"] == case["needed"], case


def test_prefill_sized_steps_and_plain_cpu_are_upstreams_grouped_mm(report):
    assert report["prefill_is_grouped_mm"] and report["cpu_is_grouped_mm"] and report["decode_is_fused"]


def test_tensor_parallel_shards_sum_to_the_whole_layer(report):
    assert report["tp_shards_sum_to_whole"] < 1e-5


def test_layouts_the_kernels_do_not_compute_stay_grouped_mm(report):
    assert report["other_layout_is_grouped_mm"]


def test_the_tiny_model_is_unchanged_where_it_counts(report):
    assert report["fused_impl"] == "pb_triton"
    assert all(m["same_ids"] for m in report["models"]), report["models"]
    assert max(m["max_dlogprob"] for m in report["models"]) < 1e-4


def test_the_knob_selects_the_implementation_at_load(report):
    assert report["hook"] == {"dtype": "auto", "experts_implementation": "pb_triton"}

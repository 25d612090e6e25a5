"""0390 PB_MOE_ONE_PATH: 0220's fused MoE kernels for steps of every size, under Triton's CPU
interpreter. Its bits on a GPU are checked by tests/test_kernels_gpu.py, its speed in W12."""

import pytest

from .conftest import engine_job

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def on(patched_engine, tiny_model):
    return engine_job("moe_one_path_job.py", patched_engine, tiny_model, timeout=1200, TRITON_INTERPRET="1",
                      PB_MOE_ONE_PATH="1", PB_MOE_TMA="1", PB_VARLEN_ATTENTION="1", PB_INVARIANT_GEMM="1")


def test_large_steps_run_the_fused_kernels_close_to_the_eager_experts(on):
    assert on["enabled"] is True
    assert on["large_vs_eager_max_abs"] < 1e-5  # 200 tokens x 8 experts, one pair masked


def test_a_token_gets_the_same_bits_alone_and_in_steps_of_every_size(on):
    assert on["first_token_alone_vs_among"] == {str(n): True for n in (2, 63, 64, 65, 100, 200)}


def test_the_combine_adds_a_tokens_rows_in_order(on):
    assert on["combine_is_ordered_sum"] is True
    assert on["combine_no_tokens"] == [0, 300]
    # the experts leave masked pairs' rows unwritten (not zeroed): the combine must not read them
    assert on["combine_skips_masked_rows"] is True


def test_0430_reads_the_large_steps_weights_through_tma_with_the_pointer_paths_bits(on):
    tma = on["tma"]
    assert on["tma_at_load"] is True
    # the large step with TMA off (no descriptors asked), then on (built); the decode-sized step and
    # the float32 experts ask for none or take the pointer path
    assert tma["descriptors"] == [True, False], tma
    assert tma["equal"] is True and tma["max_abs_vs_eager"] < 5e-3, tma
    assert tma["small_rows"] == [3, 64] and tma["float32_equal"] is True


def test_0910_keeps_the_decode_launch_for_steps_of_few_rows_an_expert_with_the_same_bits(on):
    rows = on["decode_rows"]
    assert rows["at_load"] == 64 and rows["after_unset"] == 0
    # 100 and 128 tokens (at most 64 rows an expert of 16) in 16-row blocks, 129 and 200 in 128-row ones
    assert rows["block_rows"] == [16, 16, 128, 128], rows
    assert rows["first_token_alone_vs_among"] == {"100": True, "128": True, "129": True, "200": True}


def test_with_the_knob_off_large_steps_are_grouped_mms_and_the_bits_move(on):
    # what the knob removes: above 64 tokens 0220 hands the step to grouped_mm
    assert on["off_first_token_equal_at_200"] is False


def test_tiny_model_gives_a_short_prompt_the_same_logprobs_alone_and_beside_longer_ones(on):
    tiny = on["tiny"]
    assert tiny["short_prompt_pairs"] <= 16 < tiny["largest_step_tokens"] * 2  # the step crossed the decode size
    assert tiny["one_path"] == {"logprobs_equal": True, "tokens_equal": True, "max_abs_diff": 0.0}

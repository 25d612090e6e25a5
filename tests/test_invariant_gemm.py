"""0380 PB_INVARIANT_GEMM: torch's mm and addmm as GEMMs whose sums are fixed by the weight's
shape, under Triton's CPU interpreter.

Checked here: the product against float64 on random shapes, a row's bits alone and among others
on both of the kernel's paths, the registration as torch's ops, a router's float32 logits from
half-precision operands, and, with 0370's attention, the tiny model's log probabilities the same
bits alone and batched. Its speed and its bits at bfloat16 on a GPU are for
tests/test_kernels_gpu.py and the results windows."""

import pytest

from .conftest import engine_jobs

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def on(patched_engine, tiny_model):
    """The kernels' checks and the tiny model's, two jobs side by side."""
    env = {"TRITON_INTERPRET": "1", "PB_INVARIANT_GEMM": "1", "PB_GEMM_TMA": "1", "PB_VARLEN_ATTENTION": "1"}
    with engine_jobs("invariant_gemm_job.py", patched_engine, runs={"kernels": env}, timeout=1200) as kernels, \
            engine_jobs("invariant_gemm_job.py", patched_engine, tiny_model, runs={"tiny": env}, timeout=1200) as tiny:
        return {**kernels["kernels"].report(), "tiny": tiny["tiny"].report()["tiny"]}


def test_products_match_float64_on_random_shapes(on):
    assert on["registered_at_load"] is True
    assert on["random"]["cases"] == 30
    # relative to the sum of the terms' sizes: float32 sums, then the output's rounding
    assert on["random"]["worst_relative"]["float32"] < 1e-6
    assert on["random"]["worst_relative"]["float16"] < 2e-3


def test_a_row_gets_the_same_bits_alone_and_among_others_on_both_paths(on):
    rows = on["rows"]
    assert rows["chunks"] > 1  # the K sum really is cut into chunks
    assert all(rows["chunk_programs"].values()), rows
    assert all(rows["one_program_a_tile"].values()), rows


def test_torchs_ops_and_linear_layers_run_the_kernel(on):
    ops = on["torch_ops"]
    # F.linear on [5, 3, 40] (one addmm of 15 rows), x @ w.T, and addmm with beta/alpha: the kernel;
    # the float64 product: torch's
    assert ops["kernel_rows"] == [15, 15, 15]
    assert ops["linear_close"] and ops["mm_close"] and ops["addmm_scaled_close"]
    assert ops["float64_dtype"] == "torch.float64" and ops["float64_close"]
    assert ops["empty"] == [0, 24]
    assert ops["k_zero_with_bias"] is True


def test_router_logits_sum_half_precision_operands_in_float32_the_same_alone_and_batched(on):
    router = on["router"]
    assert router["chunks"] > 1  # 128 experts: the K sum is cut so one row has programs enough
    assert router["dtype"] == "torch.float32"
    assert router["worst_abs"] < 1e-4  # float32 sums of exact products; the operands are exact in float64 too
    assert all(router["alone_equal"].values()), router
    assert all(router["alone_equal_one_program"].values()), router


def test_tma_reads_give_the_pointer_paths_bits_where_the_operands_allow(on):
    tma = on["tma"]
    assert on["tma_at_load"] is True
    for label in ("one chunk, bias", "narrow, 16 chunks", "chunked, K off 64, bias"):
        assert tma[label]["tma"] is True and tma[label]["equal"] is True, (label, tma[label])
    assert tma["narrow, 16 chunks"]["chunks"] == 16 and tma["chunked, K off 64, bias"]["chunks"] > 1
    # the router's float32 logits from half operands through TMA; rows 1,026 bytes apart cannot be
    # read by TMA and take the pointer path, with the same bits
    assert tma["router"] == {"dtype": "torch.float32", "tma": [True], "equal": True, "unaligned_tma": [False],
                             "unaligned_equal": True}
    assert tma["small_rows"] == {"descriptors_asked": [], "equal": True}  # 200 rows: a decode-sized step
    # a half-precision row alone (chunks as programs) against the same row among 2 ... 300 rows read through TMA
    assert tma["rows"] == {"300": True, "2": True, "65": True, "130": True, "tma": [True] * 4}, tma["rows"]


def test_restore_gives_torchs_own_product_back(on):
    assert on["restored"] == {"registered": False, "mm_is_torchs": True, "router_is_torchs": True}


def test_tiny_model_with_0370_gives_a_request_the_same_logprobs_alone_and_batched(on):
    tiny = on["tiny"]
    assert tiny["prompts"] == 4 and tiny["logprob_counts"] == [10, 10, 10, 10]
    assert all(tiny["tokens_equal"]) and all(tiny["logprobs_equal"]), tiny
    assert tiny["max_abs_diff"] == 0.0

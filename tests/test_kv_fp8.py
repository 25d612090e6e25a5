"""0830 PB_KV_FP8: the paged KV cache in e4m3 with a float32 scale a token and KV head; 0840
PB_KV_INT8: the same rows in int8.

The job (tests/kv_fp8_job.py) runs under Triton's CPU interpreter, once a format: the rows'
quantization and layout, and the tiny model's batching loop with the cache in 8 bits, attended
through upstream's gather (dequantized) and through 0750's kernels reading the 8-bit rows. On the
GPU: tests/test_kernels_gpu.py. Through a server: tests/test_kv_fp8_live.py."""

import pytest

from .conftest import engine_jobs

pytestmark = pytest.mark.engine

# Each format and the knob that picks it.
FORMATS = {"e4m3": {"PB_KV_FP8": "1"}, "int8": {"PB_KV_INT8": "1"}}


@pytest.fixture(scope="module")
def jobs(patched_engine, tiny_model):
    """Both formats' jobs, started together (each keeps one core busy)."""
    with engine_jobs("kv_fp8_job.py", patched_engine, tiny_model, runs=FORMATS, timeout=900, TRITON_INTERPRET="1",
                     PB_VARLEN_ATTENTION="1", PB_VARLEN_FAST="1", PB_SPLIT_DECODE="1", PB_CACHE_READ="1") as started:
        yield started


@pytest.fixture(scope="module", params=list(FORMATS))
def report(request, jobs):
    got = jobs[request.param].report()
    assert got["enabled"] is True and got["format"] == request.param
    return got


def test_rows_hold_8_bits_scaled_per_token_and_head(report):
    rows = report["rows"]
    if report["format"] == "e4m3":
        # 3 mantissa bits: an element is off by at most 1/16 of its head's largest magnitude; the
        # head's scale brings that magnitude into (224, 448] (224 after rounding)
        assert rows["element"] == "float8_e4m3fn" and rows["relative_error"] <= 1 / 16
        assert 224 <= rows["head_max"][0] and rows["head_max"][1] <= 448
    else:
        # integers: off by at most half a step, the head's largest magnitude in (63.5, 127]
        assert rows["element"] == "int8" and rows["relative_error"] <= 0.5 / 63.5
        assert 64 <= rows["head_max"][0] and rows["head_max"][1] <= 127
    assert rows["scales_powers_of_two"] is True
    assert rows["zero_head_zero"] is True
    # a read gives the values' round trip; a write touches no other row
    assert rows["read_is_round_trip"] is True and rows["untouched_rows_zero"] is True
    # 8 KV heads of 128: 1,024 bytes of elements and 32 of scales, where bfloat16 takes 2,048
    assert rows["row_bytes_air"] == 1056 and rows["row_bytes_air_tp2"] == 528 and rows["row_bytes_tiny"] == 48


def test_the_formats_round_differently(jobs):
    e4m3, int8 = (jobs[name].report()["rows"]["relative_error"] for name in FORMATS)
    assert int8 < e4m3 / 2  # int8's step is 1/127 of the head's largest, e4m3's up to 1/16 of the element


def test_a_page_takes_about_half_the_bytes_of_bfloat16(report):
    sizes = report["sizes"]
    assert sizes["page_bf16_air"] == 2 * 256 * 8 * 128 * 2
    assert sizes["page_fp8_air"] == 2 * 256 * 1056
    assert sizes["page_bf16_air"] / sizes["page_fp8_air"] > 1.9
    assert sizes["page_float32"] == 2 * 256 * 2 * 16 * 4 and sizes["page_fp8"] == 2 * 256 * 48


def test_kernels_read_the_8_bit_pages_in_every_step(report):
    loop = report["loop"]
    assert report["read_cache"] is True and report["fast"] is True
    assert loop["prompt_lengths"] == [400, 150, 20] and loop["reply_lengths"] == [10, 10, 10]
    # every run wrote through 0830 (both layers, every step) but the full-precision one
    assert loop["writes"]["bf16"] == 0 and min(v for k, v in loop["writes"].items() if k != "bf16") >= 2 * 10
    # with 0750 every attention call, the fresh prompts' first step included, reads the 8-bit rows
    assert loop["pages_calls_all_fp8"] is True and loop["calls"] >= 2 * 10 and loop["gather_fp8_calls"] == 0
    # prompt rows read 0830's dequantized gather: the bits of upstream's update with the knob (the
    # gather dequantized) and the kernels over it; decode rows read the 8-bit rows in float16 and
    # scale scores and weights: close; upstream's sdpa over the gather gives the same replies
    assert loop["same_calls"] is True and loop["prompt_rows"] > 400 and loop["decode_rows"] >= 2 * 3 * 9
    assert loop["prompt_rows_equal_bits"] is True and loop["decode_rows_max_abs_diff"] < 5e-3
    assert loop["replies_equal"] is True and loop["sdpa_replies_equal"] is True
    # the 8-bit cache is another cache: the attention's outputs move
    assert loop["outputs_differ_from_full_precision"] is True


def test_a_prompt_alone_gets_the_reply_it_gets_among_others(report):
    assert report["loop"]["alone_equal_batched"] is True


def test_a_prompt_in_one_step_gets_the_reply_it_gets_in_chunks(report):
    # the 400-token prompt in one step of fresh rows, against chunks of 256 that read the first
    # chunk's rows back from the cache
    loop = report["loop"]
    assert loop["whole_prompt_replies_equal"] is True and loop["whole_calls"] < loop["calls"]

"""The series' main Triton kernels compiled for sm_90 (H100/H200) on this machine, with no GPU:
what their PTX moves per instruction. A kernel that stores its output one 2-byte value at a time
runs far below its roofline on the GPU and gives no other sign of it (W12: 0220's MoE kernels
did, in 64 stores a thread, because their column offsets passed through tl.where). The counts
come from tests/kernel_asm_job.py at the engine's launch shapes."""

import pytest

from .conftest import engine_job

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def asm(patched_engine):
    return engine_job("kernel_asm_job.py", patched_engine, timeout=600)


PROMPT_KERNELS = ("moe_gate_up_large", "moe_down_large", "invariant_gemm_prompt", "varlen_attention_prompt")


@pytest.mark.parametrize("name", PROMPT_KERNELS)
def test_prompt_sized_kernels_store_16_bytes_at_a_time_from_a_pipelined_tensor_core_loop(asm, name):
    kernel = asm[name]
    assert kernel["stores"] > 0 and kernel["stores_16b"] == kernel["stores"], kernel
    # 8 bfloat16 values a store: a 128 x 128 tile over 8 warps is 8 stores a thread, not 64
    assert kernel["stores"] * 8 == kernel["values_a_thread"], kernel
    assert kernel["async_copies"] > 0 and kernel["wgmma"] > 0, kernel  # loads run ahead of Hopper's MMAs


@pytest.mark.parametrize("name", ("moe_gate_up_decode", "moe_down_decode"))
def test_the_moe_decode_kernels_store_a_threads_values_in_one_instruction(asm, name):
    # 16 x 32 tile, 4 warps: 4 values a thread, one 8-byte store (4 single stores before W12)
    assert asm[name]["stores"] == 1, asm[name]


@pytest.mark.parametrize("name", ("fp8_gemm", "fp8_moe_gate_up", "fp8_moe_down"))
def test_fp8_kernels_run_hoppers_mma_with_pipelined_loads_at_every_step_size(asm, name):
    """0810's float8 kernels put the weight tile on the MMA's first operand, so a decode step's 16
    rows run the same warp-group MMAs as a prompt's 128 (the instruction follows the weight, which
    is what keeps a row's bits the same at every step size), from pipelined loads."""
    for label in ("decode", "large"):
        kernel = asm[f"{name}_{label}"]
        assert kernel["wgmma"] > 0 and kernel["async_copies"] > 0 and kernel["stores"] > 0, (label, kernel)


def test_last_sum_counts_a_tiles_parts_with_one_acquire_release_atomic(asm):
    """0950: the float8 decode launch with its parts added by each tile's last program keeps
    Hopper's MMA and pipelined loads, and counts the tile's parts with one atomic add whose
    acquire-release order makes the other programs' parts visible to the last."""
    kernel = asm["fp8_gemm_last_sum"]
    assert kernel["wgmma"] > 0 and kernel["async_copies"] > 0, kernel
    assert len(kernel["atomics"]) == 1 and "acq_rel" in kernel["atomics"][0] and ".add" in kernel["atomics"][0], kernel
    assert asm["fp8_gemm_decode"]["atomics"] == [], asm["fp8_gemm_decode"]


def test_step_scale_widens_the_float8_weight_without_conversion_instructions(asm):
    """0960: with each step's sum scaled, the float8 decode launch widens e4m3 to bfloat16 by
    integer operations: far fewer conversion instructions than 0810's expansion (each element
    converted to float32, scaled and rounded back), the same warp-group MMAs from pipelined loads."""
    step, expanded = asm["fp8_gemm_step_scale"], asm["fp8_gemm_decode"]
    assert step["wgmma"] > 0 and step["async_copies"] > 0 and step["stores"] > 0, step
    assert step["conversions"] * 4 < expanded["conversions"], (step, expanded)


def test_fewer_launches_compile_their_counting_prompt_kernel_and_one_launch_cache_write(asm):
    """0950: the prompt kernel counting the step's blocks from cu_q keeps its pipelined MMA loop and
    16-byte stores; the cache write moves a token's keys and values in 16-byte stores."""
    counted = asm["varlen_attention_prompt_counted"]
    assert counted["async_copies"] > 0 and counted["wgmma"] > 0 and counted["stores"] == counted["stores_16b"] > 0
    write = asm["kv_write"]
    assert write["stores"] > 0 and write["stores_16b"] == write["stores"], write

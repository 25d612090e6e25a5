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


@pytest.mark.parametrize("name", ("moe_gate_up_decode", "moe_down_decode", "moe_gate_up_large", "moe_down_large",
                                  "invariant_gemm_decode"))
def test_fp8_weight_kernels_compile_and_store_as_their_bf16_launches(asm, name):
    """0810's float8 variants (tiles expanded in registers) compile for sm_90 and store their output
    as the bf16 launch of the same tile does; their float8 weight loads are pipelined like it."""
    bf16, fp8 = asm[name], asm[f"{name}_fp8"]
    assert fp8["stores"] == bf16["stores"] and fp8["stores_16b"] == bf16["stores_16b"], (bf16, fp8)
    assert (fp8["async_copies"] > 0) == (bf16["async_copies"] > 0), (bf16, fp8)

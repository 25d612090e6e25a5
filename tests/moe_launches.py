"""The block rows of each fused MoE launch, for tests of 0910 on the GPU and under Triton's CPU
interpreter (tests/moe_one_path_job.py imports it as a plain module)."""

import contextlib


@contextlib.contextmanager
def block_rows(fused_moe):
    """While open, `fused_moe.align` records the block rows of every launch in the list it yields."""
    launches, real_align = [], fused_moe.align

    def watched(top_k_index, num_experts, block_m=fused_moe.BLOCK_M):
        launches.append(block_m)
        return real_align(top_k_index, num_experts, block_m)

    fused_moe.align = watched
    try:
        yield launches
    finally:
        fused_moe.align = real_align

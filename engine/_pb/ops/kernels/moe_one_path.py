"""0390's kernel: a token's expert rows added in the order k = 0, 1, ... in float32 (the launcher
and why in words: ops/moe_one_path.py)."""

import triton
import triton.language as tl


@triton.jit
def pb_moe_combine_ordered(y_ptr, index_ptr, out_ptr, hidden, num_experts, stride_y, stride_out,
                           TOP_K: tl.constexpr, BLOCK: tl.constexpr):
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < hidden
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        # a pair routed outside [0, num_experts) has no row: it adds nothing (the expert is
        # loaded once per column, as a vector, which Triton's CPU interpreter needs for the mask)
        expert = tl.load(index_ptr + token * TOP_K + k + tl.zeros_like(cols))
        row_ok = ok & (expert >= 0) & (expert < num_experts)
        acc += tl.load(y_ptr + (token * TOP_K + k) * stride_y + cols, mask=row_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + token * stride_out + cols, acc.to(out_ptr.dtype.element_ty), mask=ok)

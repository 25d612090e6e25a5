"""PB_MOE_COMBINE's Triton kernel (see moe_combine.py), in a module of its own so that upstream's
experts code, which imports moe_combine, does not import Triton unless the knob is on."""

import triton
import triton.language as tl

from .rounding import round_to


@triton.jit
def pb_moe_combine(rows_ptr, inv_perm_ptr, weights_ptr, out_ptr, hidden, stride_rows, stride_out,
                   TOP_K: tl.constexpr, BLOCK: tl.constexpr, PROD_MODE: tl.constexpr,
                   SUM_MODE: tl.constexpr, OUT_MODE: tl.constexpr):
    token = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < hidden
    acc0 = tl.zeros((BLOCK,), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK,), dtype=tl.float32)
    acc2 = tl.zeros((BLOCK,), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        pair = token * TOP_K + k
        row = tl.load(inv_perm_ptr + pair)
        weight = tl.load(weights_ptr + pair).to(tl.float32)
        value = tl.load(rows_ptr + row * stride_rows + cols, mask=valid, other=0.0).to(tl.float32)
        product = round_to(value * weight, PROD_MODE)
        if k % 4 == 0:
            acc0 = acc0 + product
        elif k % 4 == 1:
            acc1 = acc1 + product
        elif k % 4 == 2:
            acc2 = acc2 + product
        else:
            acc3 = acc3 + product
    total = round_to(((acc0 + acc1) + acc2) + acc3, SUM_MODE)
    out = round_to(total, OUT_MODE)
    tl.store(out_ptr + token * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=valid)

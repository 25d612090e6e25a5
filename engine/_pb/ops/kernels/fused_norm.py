"""0300's kernel: GLM-4.5's RMSNorm, one program a row (the launcher and its rounding in words:
ops/fused_norm.py)."""

import triton
import triton.language as tl

from .rounding import round_to


@triton.jit
def pb_rms_norm(x_ptr, w_ptr, out_ptr, n_cols, stride_row, eps, inv_n,
                BLOCK: tl.constexpr, IN_MODE: tl.constexpr, OUT_MODE: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    valid = offs < n_cols
    x = tl.load(x_ptr + row * stride_row + offs, mask=valid, other=0.0).to(tl.float32)
    variance = tl.sum(x * x, axis=0) * inv_n
    y = round_to(x * tl.math.rsqrt(variance + eps), IN_MODE)
    w = tl.load(w_ptr + offs, mask=valid, other=0.0).to(tl.float32)
    out = round_to(w * y, OUT_MODE)
    tl.store(out_ptr + row * n_cols + offs, out.to(out_ptr.dtype.element_ty), mask=valid)

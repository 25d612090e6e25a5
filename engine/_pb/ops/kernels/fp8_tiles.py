"""0810's float8 product, shared by 0380's GEMM and 0220's experts kernels: a weight's float8 rows
expanded with their blocks' scales in registers, times activation rows, summed as the transposed
tile (weight rows down, activation rows across)."""

import triton
import triton.language as tl


@triton.jit
def expanded_sum(w_ptr, x_ptr, s_ptr, w_rows, w_ok, s_rows, x_rows, x_ok, k_start, k_stop, k_offset, stride_w,
                 stride_x, stride_sn, stride_sk, SCALE_K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                 BK: tl.constexpr, PRECISION: tl.constexpr):
    """float32 [BN, BM]: sum over k in [k_start, k_stop) of W'[w_rows, k] * X[x_rows, k], where W' is
    the float8 W expanded to X's type, `float(w) * s[s_rows[n], (k + k_offset) // SCALE_K]` rounded
    once: the values a dequantized copy of the weight holds. W and X are K-contiguous; `k_offset`
    is the model-wide column of local column 0 (a tensor-parallel shard's start). Each BK step
    lies in one scale column (the launchers pick BK so). The weight is the dot's first operand:
    on sm_90 a first operand made in registers is read from them, and the tensor-core instruction
    follows the weight tile, not the number of activation rows, so a row's bits do not depend on
    how many rows share the step (W53)."""
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k in range(k_start, k_stop, BK):
        ks = k + tl.arange(0, BK)
        k_ok = ks < k_stop
        w = tl.load(w_ptr + w_rows[:, None] * stride_w + ks[None, :], mask=w_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptr + x_rows[None, :] * stride_x + ks[:, None], mask=x_ok[None, :] & k_ok[:, None], other=0.0)
        scale = tl.load(s_ptr + s_rows * stride_sn + ((k + k_offset) // SCALE_K) * stride_sk)
        acc = tl.dot((w.to(tl.float32) * scale[:, None]).to(x.dtype), x, acc, input_precision=PRECISION)
    return acc

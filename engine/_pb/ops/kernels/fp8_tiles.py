"""0810's float8 product, shared by 0380's GEMM and 0220's experts kernels: a weight's float8 rows
expanded with their blocks' scales in registers, times activation rows, summed as the transposed
tile (weight rows down, activation rows across)."""

import triton
import triton.language as tl


TWO_POW_120 = tl.constexpr(2.0 ** 120)  # 0960: e4m3's bits placed in a wider float's are its value times 2 ** -120


@triton.jit
def unscaled(w, dtype: tl.constexpr):
    """PB_FP8_STEP_SCALE (0960): e4m3 elements as `dtype` (bfloat16 or float32) by their bits alone,
    `float(w) * 2 ** -120` exactly: the sign to the top, exponent and mantissa (e4m3's 4 + 3 bits)
    to the low end of the wider exponent and the top of its mantissa, so e4m3's exponent bias 7
    becomes the wider one's 127 less 120, and e4m3's subnormals land on the wider subnormals of the
    same value. Integer operations only, where the conversion instructions take a quarter of the
    SM's issue rate. e4m3fn's NaN (0x7f / 0xff) becomes a finite number."""
    b = w.to(tl.uint8, bitcast=True)
    if dtype == tl.bfloat16:
        b16 = b.to(tl.uint16)
        widened = (((b16 & 0x80) << 8) | ((b16 & 0x7F) << 4)).to(tl.bfloat16, bitcast=True)
    else:
        b32 = b.to(tl.uint32)
        widened = (((b32 & 0x80) << 24) | ((b32 & 0x7F) << 20)).to(tl.float32, bitcast=True)
    return widened


@triton.jit
def expanded_sum(w_ptr, x_ptr, s_ptr, w_rows, w_ok, s_rows, x_rows, x_ok, k_start, k_stop, k_offset, stride_w,
                 stride_x, stride_sn, stride_sk, SCALE_K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                 BK: tl.constexpr, PRECISION: tl.constexpr, STEP_SCALE: tl.constexpr = False):
    """float32 [BN, BM]: sum over k in [k_start, k_stop) of W'[w_rows, k] * X[x_rows, k], where W' is
    the float8 W expanded to X's type, `float(w) * s[s_rows[n], (k + k_offset) // SCALE_K]` rounded
    once: the values a dequantized copy of the weight holds. W and X are K-contiguous; `k_offset`
    is the model-wide column of local column 0 (a tensor-parallel shard's start). Each BK step
    lies in one scale column (the launchers pick BK so). The weight is the dot's first operand:
    on sm_90 a first operand made in registers is read from them, and the tensor-core instruction
    follows the weight tile, not the number of activation rows, so a row's bits do not depend on
    how many rows share the step (W53).

    STEP_SCALE (0960; X bfloat16 or float32): each BK step sums the unscaled e4m3 values (exact in
    X's type, `unscaled`) times X, and that float32 sum is multiplied by the rows' scales (times
    2 ** 120) as it is added: no per-element multiply or rounding of the expanded weight. Other
    bits than the expansion (the weight is not rounded to X's type), still fixed by the weight's
    shape and the depth alone. The launchers take it only where every scale is below 2 ** 7."""
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k in range(k_start, k_stop, BK):
        ks = k + tl.arange(0, BK)
        k_ok = ks < k_stop
        w = tl.load(w_ptr + w_rows[:, None] * stride_w + ks[None, :], mask=w_ok[:, None] & k_ok[None, :], other=0.0)
        x = tl.load(x_ptr + x_rows[None, :] * stride_x + ks[:, None], mask=x_ok[None, :] & k_ok[:, None], other=0.0)
        scale = tl.load(s_ptr + s_rows * stride_sn + ((k + k_offset) // SCALE_K) * stride_sk)
        if STEP_SCALE:
            part = tl.dot(unscaled(w, x.dtype), x, input_precision=PRECISION)
            acc += part * (scale * TWO_POW_120)[:, None]
        else:
            acc = tl.dot((w.to(tl.float32) * scale[:, None]).to(x.dtype), x, acc, input_precision=PRECISION)
    return acc

"""PB_KV_FP8's kernels (see kv_fp8.py): the write of a step's new keys and values to the cache's
8-bit rows (e4m3, or int8 with 0840) and scales in one launch, and the dequantizing gather of the
prompt rows' keys."""

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .varlen_attention import count_past


@triton.jit
def quantize_row(x_ptr, data_ptr, scale_ptr, row, token, heads, dims, ok, stride_xt, stride_xh, stride_dt,
                 stride_st, HEAD_DIM: tl.constexpr, TOP: tl.constexpr, TOP_EXPONENT: tl.constexpr,
                 TOP_MANTISSA: tl.constexpr, INT8: tl.constexpr):
    """One token's KV heads [BLOCK_H, dim] to the format's elements at cache row `row`, each head
    scaled by the smallest power of two that brings its largest magnitude to TOP (448, e4m3; 127,
    int8 with 0840) or below: kv_fp8.power_scales and kv_fp8.quantize, the same bits."""
    x = tl.load(x_ptr + token * stride_xt + heads[:, None] * stride_xh + dims[None, :], mask=ok[:, None],
                other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=1)
    bits = amax.to(tl.int32, bitcast=True)
    exponent = ((bits >> 23) & 0xFF) - 127 - TOP_EXPONENT + ((bits & 0x7FFFFF) > TOP_MANTISSA).to(tl.int32)
    exponent = tl.minimum(tl.maximum(exponent, -126), 126)
    scale = tl.where(amax == 0, 1.0, ((exponent + 127) << 23).to(tl.float32, bitcast=True))
    inverse = tl.where(amax == 0, 1.0, ((127 - exponent) << 23).to(tl.float32, bitcast=True))
    y = tl.minimum(tl.maximum(x * inverse[:, None], -TOP), TOP)
    if INT8:
        y = libdevice.rint(y)  # to nearest, ties to even, as torch.round
    tl.store(data_ptr + row * stride_dt + heads[:, None] * HEAD_DIM + dims[None, :], y.to(data_ptr.dtype.element_ty),
             mask=ok[:, None])
    tl.store(scale_ptr + row * stride_st + heads, scale, mask=ok)


@triton.jit
def pb_kv_fp8_write(k_ptr, v_ptr, kd_ptr, vd_ptr, ks_ptr, vs_ptr, idx_ptr, stride_kt, stride_kh, stride_vt,
                    stride_vh, stride_dt, stride_st, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
                    BLOCK_H: tl.constexpr, TOP: tl.constexpr, TOP_EXPONENT: tl.constexpr,
                    TOP_MANTISSA: tl.constexpr, INT8: tl.constexpr):
    """One program a token: its keys and its values to their cache row index[token]."""
    token = tl.program_id(0).to(tl.int64)
    row = tl.load(idx_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    ok = heads < KV_HEADS
    quantize_row(k_ptr, kd_ptr, ks_ptr, row, token, heads, dims, ok, stride_kt, stride_kh, stride_dt, stride_st,
                 HEAD_DIM, TOP, TOP_EXPONENT, TOP_MANTISSA, INT8)
    quantize_row(v_ptr, vd_ptr, vs_ptr, row, token, heads, dims, ok, stride_vt, stride_vh, stride_dt, stride_st,
                 HEAD_DIM, TOP, TOP_EXPONENT, TOP_MANTISSA, INT8)


@triton.jit
def dequantize_rows(data_ptr, scale_ptr, out_ptr, rows, places, ok, head, dims, stride_dt, stride_st, stride_ot,
                    HEAD_DIM: tl.constexpr):
    """One KV head of a block of cache rows, e4m3 or int8 times its power-of-two scale (exact), at `places`."""
    x = tl.load(data_ptr + rows[:, None] * stride_dt + head * HEAD_DIM + dims[None, :], mask=ok[:, None], other=0.0)
    scale = tl.load(scale_ptr + rows * stride_st + head, mask=ok, other=0.0)
    tl.store(out_ptr + places[:, None] * stride_ot + head * HEAD_DIM + dims[None, :],
             (x.to(tl.float32) * scale[:, None]).to(out_ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def pb_kv_fp8_gather(kd_ptr, vd_ptr, ks_ptr, vs_ptr, k_out, v_out, idx_ptr, cu_q_ptr, cu_k_ptr, sequences, stride_dt,
                     stride_st, stride_ot, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr,
                     SEQ_CHUNK: tl.constexpr):
    """kv_fp8.gather_prompts: program p takes the p-th block of BLOCK keys counted over the sequences
    of more than one query token, in order (counted SEQ_CHUNK sequences at a time), and writes them
    dequantized at their place in the step's key order; programs past the last block return, so a
    step of decode rows alone costs one launch of programs that count and leave."""
    pid = tl.program_id(0)
    seq = tl.zeros((), dtype=tl.int32)
    before = tl.zeros((), dtype=tl.int32)  # the blocks of the sequences before it
    seen = tl.zeros((), dtype=tl.int32)
    for first in range(0, sequences, SEQ_CHUNK):
        ids = first + tl.arange(0, SEQ_CHUNK)
        ok = ids < sequences
        q_len = tl.load(cu_q_ptr + ids + 1, mask=ok, other=0) - tl.load(cu_q_ptr + ids, mask=ok, other=0)
        k_len = tl.load(cu_k_ptr + ids + 1, mask=ok, other=0) - tl.load(cu_k_ptr + ids, mask=ok, other=0)
        blocks = tl.where(ok & (q_len > 1), (k_len + BLOCK - 1) // BLOCK, 0)
        seq, before, seen = count_past(pid, blocks, seq, before, seen)
    if pid < seen:
        block = pid - before
        k_start = tl.load(cu_k_ptr + seq)
        k_len = tl.load(cu_k_ptr + seq + 1) - k_start
        keys = block * BLOCK + tl.arange(0, BLOCK)
        ok = keys < k_len
        rows = tl.load(idx_ptr + k_start + keys, mask=ok, other=0).to(tl.int64)
        places = (k_start + keys).to(tl.int64)
        dims = tl.arange(0, HEAD_DIM)
        for head in tl.static_range(KV_HEADS):
            dequantize_rows(kd_ptr, ks_ptr, k_out, rows, places, ok, head, dims, stride_dt, stride_st, stride_ot,
                            HEAD_DIM)
            dequantize_rows(vd_ptr, vs_ptr, v_out, rows, places, ok, head, dims, stride_dt, stride_st, stride_ot,
                            HEAD_DIM)

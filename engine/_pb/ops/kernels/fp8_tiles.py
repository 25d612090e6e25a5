"""0810's tile expansion, shared by 0380's GEMM and 0220's experts kernels: a float8 weight tile
turned into the activations' type with its blocks' scales, in registers."""

import triton
import triton.language as tl


@triton.jit
def expand(w, s_ptr, n_blocks, s_k_ptr, ks, k_last, stride_sn, stride_sk, dtype: tl.constexpr):
    """w [BK, BN] float8 (k down, weight rows across) times its scales: grid[n_blocks[n], s_k[k]],
    `n_blocks` the grid row of each weight row, `s_k_ptr` the grid column of each k; `k_last` the
    last k in range (k past it are masked zeros). A tile whose k lie in one grid column (most:
    blocks are 128 deep) loads one scale a weight row; else one an element. Same values either
    way: float(w) * scale, rounded once to `dtype`."""
    first = tl.load(s_k_ptr + tl.min(ks, axis=0)).to(tl.int64)
    last = tl.load(s_k_ptr + tl.minimum(tl.max(ks, axis=0), k_last)).to(tl.int64)
    if first == last:
        row = tl.load(s_ptr + n_blocks * stride_sn + first * stride_sk)
        scale = tl.broadcast_to(row[None, :], w.shape)
    else:
        k_blocks = tl.load(s_k_ptr + tl.minimum(ks, k_last)).to(tl.int64)
        scale = tl.load(s_ptr + n_blocks[None, :] * stride_sn + k_blocks[:, None] * stride_sk)
    return (w.to(tl.float32) * scale).to(dtype)

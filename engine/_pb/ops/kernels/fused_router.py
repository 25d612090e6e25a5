"""0280's kernel: GLM-4.5's expert choice after the router's logits, one program a row
(the launcher and the math in words: ops/fused_router.py)."""

import triton
import triton.language as tl


@triton.jit
def pb_router_select(logits_ptr, bias_ptr, weights_ptr, index_ptr, n_experts, scale, stride_row,
                     E: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, NORM: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, E)
    valid = offs < n_experts
    x = tl.load(logits_ptr + row * stride_row + offs, mask=valid, other=0.0)
    s = 1.0 / (1.0 + tl.exp(-x))
    choice = tl.where(valid, s + tl.load(bias_ptr + offs, mask=valid, other=0.0), float("-inf"))
    slots = tl.arange(0, KP)
    picked = tl.zeros((KP,), dtype=tl.int64)
    weights = tl.zeros((KP,), dtype=tl.float32)
    for j in tl.static_range(K):
        best = tl.max(choice, axis=0)
        idx = tl.min(tl.where(choice == best, offs, E), axis=0)
        w = tl.sum(tl.where(offs == idx, s, 0.0), axis=0)
        picked = tl.where(slots == j, idx.to(tl.int64), picked)
        weights = tl.where(slots == j, w, weights)
        choice = tl.where(offs == idx, float("-inf"), choice)
    if NORM:
        weights = weights / (tl.sum(weights, axis=0) + 1e-20)
    weights = weights * scale
    keep = slots < K
    tl.store(index_ptr + row * K + slots, picked, mask=keep)
    tl.store(weights_ptr + row * K + slots, weights, mask=keep)


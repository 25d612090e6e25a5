"""0290's kernel: GLM-4.5's rotary embedding of queries and keys in one launch (the launcher and
its rounding in words: ops/fused_rope.py). `_rotate` is a module-level jit function because
Triton's interpreter looks a kernel's helpers up in its module."""

import triton
import triton.language as tl

from .rounding import round_to


@triton.jit
def _rotate(src, dst, cos, sin, rows, R: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr):
    """Rotate one head of BT tokens: src, dst, cos, sin are [BT] row pointers, rows masks them."""
    offs = tl.arange(0, D)[None, :]
    rotary = offs < R
    half = R // 2
    partner = tl.where(offs < half, offs + half, offs - half)
    live = rows[:, None]
    x = tl.load(src[:, None] + offs, mask=live, other=0.0).to(tl.float32)
    xp = tl.load(src[:, None] + partner, mask=live & rotary, other=0.0).to(tl.float32)
    xp = tl.where(offs < half, -xp, xp)
    c = tl.load(cos[:, None] + offs, mask=live & rotary, other=0.0).to(tl.float32)
    s = tl.load(sin[:, None] + offs, mask=live & rotary, other=0.0).to(tl.float32)
    out = round_to(round_to(x * c, MODE) + round_to(xp * s, MODE), MODE)
    out = tl.where(rotary, out, x)
    tl.store(dst[:, None] + offs, out.to(dst.dtype.element_ty), mask=live)

@triton.jit
def pb_rope(q_ptr, k_ptr, cos_ptr, sin_ptr, q_out, k_out, tokens, seq, heads_q,
            q_sb, q_sh, q_ss, k_sb, k_sh, k_ss, c_sb, c_ss,
            HEADS_K: tl.constexpr, R: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr,
            BT: tl.constexpr):
    token = tl.program_id(0) * BT + tl.arange(0, BT)
    head = tl.program_id(1)
    rows = token < tokens
    b = token // seq
    s = token % seq
    cos = cos_ptr + b * c_sb + s * c_ss
    sin = sin_ptr + b * c_sb + s * c_ss
    if head < heads_q:
        _rotate(q_ptr + b * q_sb + head * q_sh + s * q_ss,
                q_out + ((b * heads_q + head) * seq + s) * D, cos, sin, rows, R, D, MODE)
    else:
        h = head - heads_q
        _rotate(k_ptr + b * k_sb + h * k_sh + s * k_ss,
                k_out + ((b * HEADS_K + h) * seq + s) * D, cos, sin, rows, R, D, MODE)


"""PB_FUSED_ROPE: GLM-4.5's rotary position embedding of queries and keys as one Triton launch.

Upstream's `apply_rotary_pos_emb` rotates the first `rotary_dim` channels of each head with
six kernels per tensor (a multiply by cos, a negation and a concatenation for the half
rotation, a multiply by sin, an add, and a concatenation with the channels that pass
through): twelve launches per layer for the queries and keys, about 0.25 ms of a 4 ms C1
decode step on an H200 (W07's TP=1 profile). Here one program per head and token (or block
of PREFILL_TOKENS tokens, in long steps) writes

    out[i] = x[i] * cos[i] + rot[i] * sin[i]    for i < rotary_dim, rot = cat(-x2, x1)
    out[i] = x[i]                               for the channels past rotary_dim

rounding to the tensor's dtype after every operation, as upstream's separate kernels do:
each product of two bf16 (or fp16) values is exact in float32 and is then rounded to
nearest-even, and so is the sum. So the results are upstream's, bit for bit. The outputs are
new contiguous [batch, heads, seq, head_dim] tensors, the layout upstream's concatenation
gives, so every later kernel sees what it saw before.

The rounding is `triton_round.round_to`, which gives the GPU's rounding under Triton's CPU
interpreter too (the tests). Fusing a multiply into the following add (an FMA) would round
once instead of twice, so kernels are compiled without it. Shapes other than upstream's decode and prefill layout, and
devices Triton cannot drive, run upstream's function. With the knob on at model load, the
modeling module's `apply_rotary_pos_emb` is replaced (`at_load`), so no step reads the knob.
"""


import torch

from .. import knobs
from .common import INTERPRET, MODES, TRITON, Swap, kernels


# A program rotates one head of one token in decode-sized steps, and of this many tokens in steps
# at least this long (prefill), where one token's programs were too small to keep the GPU busy
# (W09: 6.8 ms of an 8K prompt's 0.17 s, four times what its bytes take to move).
PREFILL_TOKENS = 16


def on() -> bool:
    return bool(knobs.get("PB_FUSED_ROPE"))


def _modeling():
    from ...models.glm4_moe import modeling_glm4_moe

    return modeling_glm4_moe


SWAP = Swap(_modeling, "apply_rotary_pos_emb")


def fits(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int) -> bool:
    """The layout the kernel computes: q, k [batch, heads, seq, head_dim] with unit channel stride,
    cos, sin [batch or 1, seq, rotary_dim], one float dtype, a power-of-two head_dim."""
    if unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape != sin.shape:
        return False
    if not TRITON or not (q.is_cuda or INTERPRET) or {k.device, cos.device, sin.device} != {q.device}:
        return False
    if q.dtype not in MODES or {k.dtype, cos.dtype, sin.dtype} != {q.dtype}:
        return False
    batch, _, seq, dim = q.shape
    rotary = cos.shape[-1]
    return (k.shape[0] == batch and k.shape[2] == seq and k.shape[3] == dim and cos.shape[0] in (1, batch)
            and cos.shape[1] == seq and 0 < rotary <= dim and rotary % 2 == 0 and dim & (dim - 1) == 0
            and q.stride(-1) == 1 and k.stride(-1) == 1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """The modeling module's apply_rotary_pos_emb, with one launch for queries and keys."""
    if not fits(q, k, cos, sin, unsqueeze_dim):
        return SWAP.upstream()(q, k, cos, sin, unsqueeze_dim)
    batch, heads_q, seq, dim = q.shape
    heads_k = k.shape[1]
    q_out = torch.empty((batch, heads_q, seq, dim), dtype=q.dtype, device=q.device)
    k_out = torch.empty((batch, heads_k, seq, dim), dtype=k.dtype, device=k.device)
    if q_out.numel() == 0 and k_out.numel() == 0:
        return q_out, k_out
    cos, sin = cos.contiguous(), sin.contiguous()
    c_sb = 0 if cos.shape[0] == 1 else cos.stride(0)
    tokens = batch * seq
    block = PREFILL_TOKENS if tokens >= PREFILL_TOKENS else 1
    kernels("fused_rope").pb_rope[(-(-tokens // block), heads_q + heads_k)](
        q, k, cos, sin, q_out, k_out, tokens, seq, heads_q,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2), c_sb, cos.stride(1),
        HEADS_K=heads_k, R=cos.shape[-1], D=dim, MODE=MODES[q.dtype], BT=block, enable_fp_fusion=False)
    return q_out, k_out


def at_load() -> None:
    """The model-load hook: with the knob on, GLM-4.5's attention takes the fused rotation."""
    if on():
        SWAP.install(apply_rotary_pos_emb,
                     "PB_FUSED_ROPE: GLM-4.5's queries and keys rotate in one Triton launch a layer")


def restore() -> None:
    """Give the modeling module its own function back (for in-process A/Bs and tests)."""
    SWAP.restore()

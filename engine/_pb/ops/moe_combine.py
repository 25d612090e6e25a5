"""PB_MOE_COMBINE: the end of upstream's grouped_mm experts forward as one Triton kernel.

After the down projection, upstream's `grouped_mm_experts_forward` holds one output row per
(token, expert) pair, sorted by expert, and finishes with four passes over them:

    weighted = rows * weights_sorted[:, None]     # float32 when the routing weights are
    weighted = weighted[inv_perm]                 # back to (token, k) order
    out = weighted.view(T, K, H).sum(dim=1)       # float32
    return out.to(hidden_states.dtype)

For an 8K-token prompt on GLM-4.5-Air that is 65,536 rows of 4,096: a 1 GB float32 product
written, gathered into a second 1 GB tensor, read again by the sum, then cast; about 2 ms a
layer of an H200 (W08's 8K profile: 13.7 ms of float32 multiplies, 3.4 ms of sums and most of
9 ms of gathers in a 0.26 s prompt). Here one program per (token, column block) reads the K
bf16 rows of its token where they lie, multiplies each by its routing weight and sums them,
writing only the output.

The arithmetic is upstream's: each product is rounded to the dtype torch's promotion gives it,
and the K products are added in the order torch's CUDA reduction adds them for this layout (a
thread sums all K of one output into four accumulators, element k into accumulator k % 4,
then adds the four left to right), so on CUDA the bits are upstream's. Steps
with more than MAX_TOP_K pairs a token (torch would then split the sum across warps), tensors
that are not plain (tensor-parallel DTensors), other dtypes and devices Triton cannot drive
keep upstream's tail. `at_load` reads the knob once, so no step reads it.
"""

import sys

import torch

from .. import knobs
from .common import INTERPRET, MODES, TRITON, kernels

MAX_TOP_K = 16
ENABLED = False  # set by at_load: the knob on, and Triton installed, when the model was loaded
BLOCK = 1024


def on() -> bool:
    return bool(knobs.get("PB_MOE_COMBINE"))


def fits(rows: torch.Tensor, weights: torch.Tensor, top_k: int, out_dtype: torch.dtype) -> bool:
    """Inputs the kernel computes, on a device it runs on."""
    plain = all(type(t) is torch.Tensor for t in (rows, weights))
    return (plain and (rows.is_cuda or INTERPRET) and rows.dim() == 2
            and 1 <= top_k <= MAX_TOP_K and rows.dtype in MODES and weights.dtype in MODES
            and out_dtype in MODES and rows.stride(-1) == 1 and weights.device == rows.device)


def combine(rows: torch.Tensor, perm: torch.Tensor, weights: torch.Tensor, num_tokens: int, top_k: int,
            out_dtype: torch.dtype):
    """The experts' output per token, or None where upstream's tail runs (knob off, or a case
    `fits` refuses).

    rows: [pairs, hidden], pair outputs sorted by expert (row i belongs to pair perm[i]);
    weights: [pairs], the routing weights in (token, k) order.
    """
    if not ENABLED or not fits(rows, weights, top_k, out_dtype):
        return None
    pairs, hidden = rows.shape
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(pairs, device=perm.device, dtype=perm.dtype)
    prod_dtype = torch.promote_types(rows.dtype, weights.dtype)
    out = torch.empty((num_tokens, hidden), dtype=out_dtype, device=rows.device)
    if num_tokens:
        kernels("moe_combine").pb_moe_combine[(num_tokens, -(-hidden // BLOCK))](
            rows, inv_perm, weights.contiguous(), out, hidden, rows.stride(0), out.stride(0),
            TOP_K=top_k, BLOCK=BLOCK, PROD_MODE=MODES[prod_dtype], SUM_MODE=MODES[prod_dtype],
            OUT_MODE=MODES[out_dtype], num_warps=4, enable_fp_fusion=False)
    return out


def at_load() -> None:
    """The model-load hook: with the knob on, grouped_mm experts end in the fused combine."""
    global ENABLED
    knob = on()
    ENABLED = knob and TRITON
    if knob:
        sys.stderr.write("patchbay: PB_MOE_COMBINE: grouped_mm experts weight, un-sort and sum their rows "
                         "in one Triton kernel\n")


def restore() -> None:
    """Upstream's tail again (for in-process A/Bs and tests)."""
    global ENABLED
    ENABLED = False

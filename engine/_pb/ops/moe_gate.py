"""PB_MOE_GATE: the gate of upstream's grouped_mm experts forward as one Triton kernel.

Between its two grouped GEMMs the grouped_mm forward holds one [gate | up] row per (token,
expert) pair and applies the default gate, `silu(gate) * up`: one kernel writes silu(gate) in
the weights' dtype, a second reads it back with `up` and writes the product. For an 8K-token
prompt on GLM-4.5-Air those are 65,536 rows of 2 x 1,408, and the two kernels took 7.1 ms of
the prompt's 0.17 s on an H200 (W09's 8K profile with 0270). Here one program per row and
column block reads gate and up once and writes the product.

The arithmetic is torch's: silu in float32 as x / (1 + exp(-x)) with the CUDA math library's
exp and a correctly rounded division, rounded to the dtype, then the product in float32,
rounded. On the GPU the bits are upstream's; Triton's CPU interpreter has no CUDA math library,
so there (the tests) exp is numpy's and the bits can differ in the last place. Experts with
another gate or activation, tensors that are not plain (tensor-parallel DTensors), other dtypes
and devices Triton cannot drive keep upstream's gate. `at_load` reads the knob once, so no
step reads it.
"""

import sys

import torch

from .. import knobs
from .common import INTERPRET, MODES, TRITON, kernels

ENABLED = False  # set by at_load: the knob on, and Triton installed, when the model was loaded
BLOCK = 512


def on() -> bool:
    return bool(knobs.get("PB_MOE_GATE"))


def fits(experts, x: torch.Tensor) -> bool:
    """The default silu gate on a plain [pairs, 2 * inter] tensor, on a device Triton runs on."""
    from ...activations import SiLUActivation
    from ...integrations.moe import _default_apply_gate

    return (type(x) is torch.Tensor and (x.is_cuda or INTERPRET) and x.dim() == 2
            and x.shape[-1] % 2 == 0 and x.stride(-1) == 1 and x.dtype in MODES
            and getattr(type(experts), "_apply_gate", None) is _default_apply_gate
            and type(getattr(experts, "act_fn", None)) in (SiLUActivation, torch.nn.SiLU))


def apply_gate(experts, x: torch.Tensor) -> torch.Tensor:
    """The experts' gate of x = [gate | up]: the fused kernel where it fits, else upstream's."""
    if not ENABLED or not fits(experts, x):
        return experts._apply_gate(x)
    rows, inter = x.shape[0], x.shape[-1] // 2
    out = torch.empty((rows, inter), dtype=x.dtype, device=x.device)
    if rows:
        kernels("moe_gate").pb_moe_gate[(rows, -(-inter // BLOCK))](
            x, out, inter, x.stride(0), out.stride(0), BLOCK=BLOCK, MODE=MODES[x.dtype], LIBDEVICE=not INTERPRET,
            num_warps=4, enable_fp_fusion=False)
    return out


def at_load() -> None:
    """The model-load hook: with the knob on, grouped_mm experts gate in the fused kernel."""
    global ENABLED
    knob = on()
    ENABLED = knob and TRITON
    if knob:
        sys.stderr.write("patchbay: PB_MOE_GATE: grouped_mm experts apply silu(gate) * up in one Triton kernel\n")


def restore() -> None:
    """Upstream's gate again (for in-process A/Bs and tests)."""
    global ENABLED
    ENABLED = False

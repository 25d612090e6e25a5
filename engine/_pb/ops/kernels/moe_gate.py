"""PB_MOE_GATE's Triton kernel (see moe_gate.py), in a module of its own so that upstream's experts
code, which imports moe_gate, does not import Triton unless the knob is on."""

import triton
import triton.language as tl
from triton.language.extra import libdevice

from .rounding import round_to


@triton.jit
def pb_moe_gate(x_ptr, out_ptr, inter, stride_x, stride_out,
                BLOCK: tl.constexpr, MODE: tl.constexpr, LIBDEVICE: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=valid, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=valid, other=0.0).to(tl.float32)
    if LIBDEVICE:  # the GPU: the CUDA math library's expf, as torch's silu calls it
        e = libdevice.exp(-gate)
    else:  # Triton's CPU interpreter has no libdevice
        e = tl.exp(-gate)
    act = round_to(tl.math.div_rn(gate, 1.0 + e), MODE)
    out = round_to(act * up, MODE)
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=valid)

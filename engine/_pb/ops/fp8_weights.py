"""PB_FP8_WEIGHTS: serve block-quantized FP8 checkpoints, weights kept in FP8 on every device.

The FP8 releases of GLM-4.5 (and of the DeepSeek-V3 family before them) store each linear
weight as float8 e4m3 with one float32 `weight_scale_inv` per 128 x 128 block; the true weight
is `float(q) * scale_inv`. Upstream loads them into its FP8Linear / FP8Experts modules, whose
products call kernels fetched from a kernel hub at first use (nothing is fetched on a host
with no internet, and the first step fails), and on a machine without a recent GPU it
dequantizes the whole model to the compute dtype at load, a step that refuses weights whose
shape is not a whole number of blocks (GLM-4.5-Air's dense MLP, 10,944 rows, is 85.5 blocks).

With the knob on, a pre-quantized checkpoint keeps its FP8 weights on every device and the
products are weight-only FP8 (W8A16): each weight is expanded to the activations' dtype,
`(float(q) * scale_inv).to(dtype)`, exactly the values upstream's load-time dequantization
writes, and multiplied in that dtype. So a model served this way computes what its
dequantized twin (the same checkpoint expanded once, saved in the compute dtype) computes:
`tests/test_fp8_weights.py` holds the two to the same bits. The experts go through the
bf16 experts implementation of the same name (`grouped_mm`, 0220's `pb_triton`) on the
expanded weights. Here every call expands the weights it uses: the reference, correct on any
device and slow on a GPU, where kernels that expand tiles in registers take its place.

Activations are not quantized (the checkpoint's `activation_scheme` is not used): decode reads
weights, and reading one byte per weight instead of two is the gain.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from .. import knobs

# The experts implementations this module serves for FP8 experts, each through the bf16
# implementation registered under the same name: upstream's two, and 0220's.
EXPERTS_NAMES = ("grouped_mm", "batched_mm", "pb_triton")

ENABLED = False
_saved: dict = {}


def on() -> bool:
    return bool(knobs.get("PB_FP8_WEIGHTS"))


def keeps_fp8() -> bool:
    """Whether upstream's quantizer should leave a pre-quantized checkpoint in FP8 rather than
    dequantize it at load for want of a GPU (read by the 0810 hunk in its validate_environment)."""
    return on()


def dequantize(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] | list[int] | None,
               dtype: torch.dtype, offset: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """`(..., rows, cols)` FP8 weights times their scales, in `dtype`.

    `block` is the (rows, cols) a scale covers (None: one scale for the tensor). `offset` is
    where this tensor's first row and column sit inside their first block: a tensor-parallel
    shard that starts mid-block holds the scales of every block it touches, the first one
    shared with the rank before it. The product is taken in float32 and rounded once to
    `dtype`, as upstream's load-time dequantization does, so both give the same values.
    """
    q = weight.to(torch.float32)
    s = scale_inv.to(torch.float32)
    if block is None or s.dim() == 0:
        return (q * s).to(dtype)
    rows, cols = q.shape[-2:]
    row_block, col_block = block
    r = (torch.arange(rows, device=q.device) + offset[0]) // row_block
    c = (torch.arange(cols, device=q.device) + offset[1]) // col_block
    if r[-1] >= s.shape[-2] or c[-1] >= s.shape[-1]:
        raise ValueError(f"FP8 weight {tuple(q.shape)} at offset {offset} needs a scale grid of at least "
                         f"({int(r[-1]) + 1}, {int(c[-1]) + 1}) blocks of {tuple(block)}, got {tuple(s.shape)}")
    return (q * s[..., r, :][..., c]).to(dtype)


def _offset(module, name: str) -> tuple[int, int]:
    """Where a (possibly tensor-parallel) shard of `module.name` starts inside its first block."""
    return getattr(module, "_pb_fp8_offsets", {}).get(name, (0, 0))


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def linear_forward(self, input: torch.Tensor) -> torch.Tensor:
    """FP8Linear.forward: the expanded weight in the input's dtype, then a plain linear."""
    weight = _local(self.weight)
    if weight.element_size() > 1:
        return F.linear(input, weight, self.bias)
    w = dequantize(weight, _local(self.weight_scale_inv), self.block_size, input.dtype, _offset(self, "weight"))
    bias = None if self.bias is None else _local(self.bias).to(input.dtype)
    return F.linear(input, w, bias)


def experts_linear(self, input, weight, weight_scale_inv, activation_scale=None):
    """FP8Experts.linear (upstream's eager loop over the experts hit): one expert's product."""
    if weight.element_size() > 1:
        return F.linear(input, weight, None)
    return F.linear(input, dequantize(weight, weight_scale_inv, self.block_size, input.dtype))


class _Expanded:
    """An FP8 experts module seen with its weights expanded: the bf16 experts implementations
    read `gate_up_proj` / `down_proj` (or `up_proj`); everything else is the module's own."""

    def __init__(self, experts, dtype: torch.dtype):
        self._pb_source = experts
        for name in ("gate_up_proj", "up_proj", "down_proj"):
            weight = experts.__dict__.get(name, experts._parameters.get(name))
            if weight is None:
                continue
            weight = _local(weight)
            if weight.element_size() == 1:
                scales = _local(getattr(experts, f"{name}_scale_inv"))
                weight = dequantize(weight, scales, experts.block_size, dtype, _offset(experts, name))
            setattr(self, name, weight)

    def __getattr__(self, name):
        return getattr(self._pb_source, name)


def _experts_forward(name: str):
    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        from ...integrations.moe import ALL_EXPERTS_FUNCTIONS

        implementation = ALL_EXPERTS_FUNCTIONS[name]
        return implementation(_Expanded(self, hidden_states.dtype), hidden_states, top_k_index, top_k_weights)

    forward.__name__ = f"pb_fp8_{name}"
    return forward


def at_load() -> None:
    """Before the weights load: FP8 modules compute on expanded weights while the knob is on."""
    global ENABLED
    ENABLED = on()
    if not ENABLED or _saved:
        return
    from ...integrations import finegrained_fp8 as fp8
    from ...integrations.moe import ALL_EXPERTS_FUNCTIONS

    if "pb_triton" not in ALL_EXPERTS_FUNCTIONS:
        from . import fused_moe

        fused_moe.register()
    mapping = fp8.ALL_FP8_EXPERTS_FUNCTIONS._global_mapping
    _saved.update(linear=fp8.FP8Linear.forward, experts_linear=fp8.FP8Experts.linear,
                  experts={name: mapping.get(name) for name in EXPERTS_NAMES})
    fp8.FP8Linear.forward = linear_forward
    fp8.FP8Experts.linear = experts_linear
    for name in EXPERTS_NAMES:
        mapping[name] = _experts_forward(name)
    sys.stderr.write("patchbay: PB_FP8_WEIGHTS: FP8 checkpoints keep their weights in FP8; products expand "
                     "them to the activations' dtype (weight-only FP8)\n")


def restore() -> None:
    global ENABLED
    ENABLED = False
    if not _saved:
        return
    from ...integrations import finegrained_fp8 as fp8

    fp8.FP8Linear.forward = _saved["linear"]
    fp8.FP8Experts.linear = _saved["experts_linear"]
    mapping = fp8.ALL_FP8_EXPERTS_FUNCTIONS._global_mapping
    for name, function in _saved["experts"].items():
        if function is None:
            mapping.pop(name, None)
        else:
            mapping[name] = function
    _saved.clear()

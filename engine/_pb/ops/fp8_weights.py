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
               dtype: torch.dtype, index: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """`(..., rows, cols)` FP8 weights times their scales, in `dtype`.

    `block` is the (rows, cols) a scale covers (None: one scale for the tensor). `index` gives,
    for a tensor-parallel shard, the model-wide row and column of each of its rows and columns:
    a shard may start inside a block (GLM-4.5-Air's experts are 11 blocks wide, 5.5 a rank at
    TP=2), so every rank holds the whole scale grid and reads it by those. The product is taken
    in float32 and rounded once to `dtype`, as upstream's load-time dequantization does, so both
    give the same values.
    """
    q = weight.to(torch.float32)
    s = scale_inv.to(torch.float32)
    if block is None or s.dim() == 0:
        return (q * s).to(dtype)
    rows, cols = q.shape[-2:]
    if index is None:
        index = (torch.arange(rows, device=q.device), torch.arange(cols, device=q.device))
    r, c = index[0].to(q.device) // block[0], index[1].to(q.device) // block[1]
    if len(r) != rows or len(c) != cols or int(r.max()) >= s.shape[-2] or int(c.max()) >= s.shape[-1]:
        raise ValueError(f"FP8 weight {tuple(q.shape)} needs scales of blocks of {tuple(block)} up to "
                         f"({int(r.max()) + 1}, {int(c.max()) + 1}) for its {len(r)} x {len(c)} indices, "
                         f"got {tuple(s.shape)}")
    return (q * s[..., r, :][..., c]).to(dtype)


def block_scales(model) -> list[str]:
    """The names of `model`'s per-block scales (the tensor-parallel plan keeps them whole)."""
    return [name for name, p in model.named_parameters() if name.endswith("scale_inv") and p.ndim >= 2]


def _global_index(param, dim: int) -> torch.Tensor | None:
    """For a tensor-parallel shard (a DTensor), the model-wide index of each of its entries along
    `dim`, found by sharding an index the way the loader shards the weight; None when whole."""
    if not hasattr(param, "placements"):
        return None
    from ...distributed.sharding_utils import DtensorShardOperation

    dim %= param.ndim
    sharded = {p.dim % param.ndim for p in param.placements if hasattr(p, "dim")}
    if dim not in sharded:
        return None
    shape = [param.shape[d] if d == dim else 1 for d in range(param.ndim)]
    source = torch.arange(param.shape[dim]).view(shape)
    local = DtensorShardOperation(param).shard_tensor(source)
    return local.reshape(-1)


def _index(module, name: str):
    """The global rows and columns of `module.name`'s shard (after_load found them), or None."""
    return module.__dict__.get("_pb_fp8_index", {}).get(name)


def after_load(model) -> None:
    """Once the weights are loaded (a shard's parameters are DTensors here; inside a
    tensor-parallel forward they are plain local tensors): each FP8 shard's global indices."""
    if not ENABLED:
        return
    shards = 0
    for module in model.modules():
        for name, weight in module._parameters.items():
            if weight is None or weight.dtype != torch.float8_e4m3fn or not hasattr(weight, "placements"):
                continue
            rows, cols = _global_index(weight, -2), _global_index(weight, -1)
            local = _local(weight).shape
            module.__dict__.setdefault("_pb_fp8_index", {})[name] = (
                torch.arange(local[-2]) if rows is None else rows, torch.arange(local[-1]) if cols is None else cols)
            shards += 1
    if shards:
        sys.stderr.write(f"patchbay: PB_FP8_WEIGHTS: {shards} FP8 weights are tensor-parallel shards, each "
                         "reading the whole scale grid at its global rows and columns\n")


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def linear_forward(self, input: torch.Tensor) -> torch.Tensor:
    """FP8Linear.forward: the expanded weight in the input's dtype, then a plain linear."""
    weight = _local(self.weight)
    if weight.element_size() > 1:
        return F.linear(input, weight, self.bias)
    w = dequantize(weight, _local(self.weight_scale_inv), self.block_size, input.dtype,
                   _index(self, "weight"))
    bias = None if self.bias is None else _local(self.bias).to(input.dtype)
    return F.linear(input, w, bias)


def experts_linear(self, input, weight, weight_scale_inv, activation_scale=None):
    """FP8Experts.linear (upstream's eager loop over the experts hit): one expert's product."""
    if weight.element_size() > 1:
        return F.linear(input, weight, None)
    if hasattr(weight, "placements"):
        raise NotImplementedError("PB_FP8_WEIGHTS: the eager experts loop does not run tensor-parallel shards; "
                                  "use the grouped_mm or pb_triton experts implementation")
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
            index = _index(experts, name)
            weight = _local(weight)
            if weight.element_size() == 1:
                scales = _local(getattr(experts, f"{name}_scale_inv"))
                weight = dequantize(weight, scales, experts.block_size, dtype, index)
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

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
`tests/test_fp8_weights.py` holds the two to the same bits.

Where the series' kernels run (a GPU, or Triton's interpreter in the tests), the products read
the float8 weights: the linears through invariant_gemm.gemm_fp8 (with PB_INVARIANT_GEMM), the
experts through 0220's float8 kernels (PB_FUSED_MOE's `pb_triton`, 0390's large steps included),
so a step reads one byte a weight. Each tile is expanded in registers to the values above and
summed as a transposed tile, the weight on the tensor core's first operand: on sm_90 that operand
is read from registers as made, and the instruction follows the weight rows, not the row count,
so a row's bits are the same among any rows (tests/test_kernels_gpu.py, W53). The linears' K is
cut into chunks of their own (invariant_gemm.fp8_chunk_k: enough programs for a decode step on
half the bytes), so the sums are the twin's to float32 rounding, not its bits, except where the
chunks coincide (the experts: W53's table has them equal on an H100).
Elsewhere each call expands the weights it uses and runs the bf16 product of the same name
(F.linear; upstream's `grouped_mm` and `batched_mm`, or 0220's fallback): the reference,
correct on any device and slow on a GPU.

Under tensor parallelism every rank keeps each weight's whole scale grid (upstream splits it
like the weight, and a shard that starts inside a block then reads no scales or the wrong
ones) and reads it at its shard's global rows and columns, found at load.

Activations are not quantized (the checkpoint's `activation_scheme` is not used): decode reads
weights, and reading one byte per weight instead of two is the gain.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from .. import knobs
from . import common
from .common import INTERPRET

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


def _blocks(module, name: str):
    """What the kernels read to expand `module.name`: the scale grid's row for each of its rows
    (int32, on the weight's device), the model-wide column of its first column (None when its
    columns are not one run, and the kernels do not take it), and the columns a scale covers."""
    return module.__dict__["_pb_fp8_blocks"][name]


def after_load(model) -> None:
    """Once the weights are loaded (a shard's parameters are DTensors here; inside a
    tensor-parallel forward they are plain local tensors): each FP8 weight's global rows and
    columns, and what the kernels read to expand it."""
    if not ENABLED:
        return
    shards = 0
    for module in model.modules():
        block = getattr(module, "block_size", None)
        for name, weight in module._parameters.items():
            if weight is None or weight.dtype != torch.float8_e4m3fn or block is None:
                continue
            rows, cols = _global_index(weight, -2), _global_index(weight, -1)
            local = _local(weight)
            shards += rows is not None or cols is not None
            rows = torch.arange(local.shape[-2]) if rows is None else rows
            cols = torch.arange(local.shape[-1]) if cols is None else cols
            module.__dict__.setdefault("_pb_fp8_index", {})[name] = (rows, cols)
            first = int(cols[0]) if len(cols) else 0
            one_run = torch.equal(cols, torch.arange(first, first + len(cols)))
            module.__dict__.setdefault("_pb_fp8_blocks", {})[name] = (
                (rows // block[0]).to(torch.int32).to(local.device), first if one_run else None, block[1])
    if shards:
        sys.stderr.write(f"patchbay: PB_FP8_WEIGHTS: {shards} FP8 weights are tensor-parallel shards, each "
                         "reading the whole scale grid at its global rows and columns\n")
    _check_step_scale(model)


def _check_step_scale(model) -> None:
    """0960: PB_FP8_STEP_SCALE in force only where every block scale of the model, times 2 ** 120,
    stays finite in float32 (below common.FP8_STEP_SCALE_MAX: a block whose largest magnitude is
    under 448 * 128); otherwise the weights are expanded as without the knob, and the log says why."""
    common.FP8_STEP_SCALE = False
    if not knobs.get("PB_FP8_STEP_SCALE"):
        return
    for name in block_scales(model):
        top = float(_local(model.get_parameter(name)).detach().abs().max())
        if not top < common.FP8_STEP_SCALE_MAX:
            sys.stderr.write(f"patchbay: PB_FP8_STEP_SCALE: not in force: {name} holds a scale of {top:g}, and the "
                             f"kernels take scales below {common.FP8_STEP_SCALE_MAX:g} only\n")
            return
    common.FP8_STEP_SCALE = True
    sys.stderr.write("patchbay: PB_FP8_STEP_SCALE: float8 products sum each 128-column step of the unscaled weight, "
                     "then scale it\n")


def _kernels(x: torch.Tensor) -> bool:
    """Whether products on `x` run through 0380's GEMM (its registration in force, a device it drives)."""
    from . import invariant_gemm

    return invariant_gemm._library is not None and x.dtype in invariant_gemm.DTYPES and (x.is_cuda or INTERPRET)


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def linear_forward(self, input: torch.Tensor) -> torch.Tensor:
    """FP8Linear.forward: the expanded weight in the input's dtype, then a plain linear."""
    weight = _local(self.weight)
    if weight.element_size() > 1:
        return F.linear(input, weight, self.bias)
    bias = None if self.bias is None else _local(self.bias).to(input.dtype)
    scales = _local(self.weight_scale_inv)
    if self.block_size is not None and _kernels(input):
        # 0380's chunks, the float8 tiles expanded in registers (None: no depth fits the blocks)
        from . import invariant_gemm

        grid_rows, k_offset, scale_k = _blocks(self, "weight")
        rows = input.reshape(-1, input.shape[-1])
        out = None if k_offset is None else invariant_gemm.gemm_fp8(rows, weight, scales, grid_rows, k_offset,
                                                                    scale_k, bias)
        if out is not None:
            return out.view(*input.shape[:-1], weight.shape[0])
    w = dequantize(weight, scales, self.block_size, input.dtype, _index(self, "weight"))
    return F.linear(input, w, bias)


def stackable(linears: list) -> bool:
    """Whether 0310 may stack these FP8Linear layers (q/k/v, gate/up) as one float8 weight: whole
    layers (not tensor-parallel shards) in float8 on one device, all with or all without bias,
    whose blocks after_load found and agree on their columns."""
    if not ENABLED or len(linears) < 2 or not all(type(layer).__name__ == "FP8Linear" for layer in linears):
        return False
    weights = [layer.weight for layer in linears]
    blocks = [layer.__dict__.get("_pb_fp8_blocks", {}).get("weight") for layer in linears]
    return not (any(b is None for b in blocks)
                or any(hasattr(p, "placements") for layer in linears for p in (layer.weight, layer.weight_scale_inv))
                or len({(b[1], b[2]) for b in blocks}) != 1 or blocks[0][1] is None
                or len({(w.dtype, w.device, w.shape[-1]) for w in weights}) != 1
                or weights[0].dtype != torch.float8_e4m3fn or weights[0].dim() != 2
                or len({layer.bias is None for layer in linears}) != 1
                or len({layer.weight_scale_inv.shape[-1] for layer in linears}) != 1)


def stack_scales(linears: list) -> tuple:
    """The scale grids of layers 0310 stacks (`stackable`) as one grid, the layers keeping views of
    it, and each stacked row's grid row: a layer's own, shifted by the grid rows above it
    (GLM-4.5-Air's dense gate ends half way through a block, so the up rows start a block of their
    own). Returns (grid, grid_rows, k_offset, scale_k), what fused_product reads."""
    grids = [layer.weight_scale_inv for layer in linears]
    blocks = [_blocks(layer, "weight") for layer in linears]
    with torch.no_grad():
        grid = torch.cat(grids, dim=0)
        shift, grid_rows = 0, []
        for layer, g, (rows, _, _) in zip(linears, grids, blocks):
            layer.weight_scale_inv.data = grid[shift:shift + g.shape[0]]
            grid_rows.append(rows + shift)
            shift += g.shape[0]
    return grid, torch.cat(grid_rows), blocks[0][1], blocks[0][2]


def fused_product(x: torch.Tensor, weight: torch.Tensor, bias, scales: tuple) -> torch.Tensor | None:
    """x times 0310's stacked float8 weight through the float8 GEMM (`scales` from stack_scales);
    None where it does not run (no kernels for x, or no depth fits): the caller runs the layers
    one by one."""
    if not _kernels(x):
        return None
    from . import invariant_gemm

    grid, grid_rows, k_offset, scale_k = scales
    bias = None if bias is None else bias.to(x.dtype)
    out = invariant_gemm.gemm_fp8(x.reshape(-1, x.shape[-1]), weight, grid, grid_rows, k_offset, scale_k, bias)
    return None if out is None else out.view(*x.shape[:-1], weight.shape[0])


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


class _Scaled:
    """An FP8 experts module as 0220's kernels read it: its local float8 weights, and in `pb_fp8`
    each one's scale grid with what else the kernels read to expand it (_blocks)."""

    def __init__(self, experts):
        self._pb_source = experts
        self.pb_fp8 = {}
        for name, short in (("gate_up_proj", "gate_up"), ("down_proj", "down")):
            self.__dict__[name] = _local(experts._parameters[name])
            self.pb_fp8[short] = (_local(getattr(experts, f"{name}_scale_inv")), *_blocks(experts, name))

    def __getattr__(self, name):
        return getattr(self._pb_source, name)


def _experts_forward(name: str):
    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        from ...integrations.moe import ALL_EXPERTS_FUNCTIONS
        from . import fused_moe

        if name == fused_moe.NAME and self.has_gate and getattr(self, "block_size", None) is not None:
            scaled = _Scaled(self)
            if fused_moe.fp8_takes(scaled.pb_fp8) and fused_moe.takes_kernels(scaled, hidden_states, top_k_index):
                return fused_moe.experts_forward(scaled, hidden_states, top_k_index, top_k_weights)
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
    ENABLED = common.FP8_STEP_SCALE = False
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

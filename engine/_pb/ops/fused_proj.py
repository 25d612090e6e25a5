"""PB_FUSED_PROJ: GLM-4.5's query, key and value projections as one GEMM, and each MLP's gate and
up projections as one.

At one token a step the attention's k_proj and v_proj (4096 x 1024 each on GLM-4.5-Air) and the
shared expert's gate_proj and up_proj (4096 x 1408) are GEMVs too small to keep the GPU's memory
busy, each with its own split-K reduction kernel: on an H200 they read at half the bandwidth
q_proj reaches (W07's TP=1 profile). With the knob on, after the model is loaded, each attention
layer's three weights are concatenated row-wise into one matrix (and their biases into one
vector), and each MLP's gate and up weights likewise; the original Linear modules keep their
weights as views of the fused rows, so no weight is held twice. A step then runs one GEMM for
q, k and v and splits its output, and one for gate and up.

Under tensor parallelism these projections are column shards (DTensors split along their rows,
`ColwiseParallel`). With PB_FUSED_PROJ_TP on too (0340), each rank fuses its own rows: the local
shards are concatenated, the layers' parameters become DTensors of views of them, and a step
runs what the layers' own inference path runs, one local GEMM on the replicated input, giving
this rank's heads and columns. FP8 layers served by 0810 (whole, not shards) are stacked as one
float8 weight, their scale grids as one grid, each row reading its own layer's scales
(fp8_weights.stack_scales), and run 0810's float8 GEMM; where that GEMM does not run (no kernels
for the input) the layers run one by one. Other layers (other quantizations, other shardings)
are left as they are. The fused GEMM sums each
output element over the same inputs, but the BLAS library may pick another kernel or split of
the sum for the wider matrix, so the bits can change. `after_load(model)` is the hook, called
once after the model's weights are loaded; the forwards check the fused weights an attribute
away, and read no knob.
"""

import sys
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from .. import knobs


QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")
FUSED = weakref.WeakSet()  # the modules after_load fused (for restore)


def on() -> bool:
    return bool(knobs.get("PB_FUSED_PROJ"))


def shards_on() -> bool:
    """PB_FUSED_PROJ_TP (0340): tensor-parallel column shards are fused too, on each rank's rows."""
    return bool(knobs.get("PB_FUSED_PROJ_TP"))


def _plain(linears: list) -> bool:
    """Plain Linear layers with plain tensors on one device and dtype, all with or all without bias."""
    if not all(type(layer) is nn.Linear for layer in linears):
        return False
    tensors = [p for layer in linears for p in (layer.weight, layer.bias) if p is not None]
    if not all(type(p.data) is torch.Tensor for p in tensors):
        return False
    return _plain_tensors([layer.weight for layer in linears], [layer.bias for layer in linears])


def _column_shards(linears: list):
    """For tensor-parallel column shards (each weight and bias a DTensor split along its rows,
    Shard(0), on one mesh; `ColwiseParallel`), their local tensors; else None."""
    try:
        from torch.distributed.tensor import DTensor, Shard
    except ImportError:
        return None
    if not all(type(layer) is nn.Linear for layer in linears):
        return None
    params = [p for layer in linears for p in (layer.weight, layer.bias) if p is not None]
    if not all(isinstance(p, DTensor) and tuple(p.placements) == (Shard(0),) for p in params):
        return None
    if len({p.device_mesh for p in params}) != 1:
        return None
    local = [[layer.weight.to_local(), None if layer.bias is None else layer.bias.to_local()] for layer in linears]
    if not all(type(t) is torch.Tensor for pair in local for t in pair if t is not None):
        return None
    return local if _plain_tensors([w for w, _ in local], [b for _, b in local]) else None


def _plain_tensors(weights: list, biases: list) -> bool:
    """Weights (and biases) on one device and dtype, 2-D, the same input width, all with or all
    without bias, not on the meta device."""
    tensors = [t for t in weights + biases if t is not None]
    return (len({(t.device, t.dtype) for t in tensors}) == 1 and all(w.dim() == 2 for w in weights)
            and len({w.shape[1] for w in weights}) == 1 and len({b is None for b in biases}) == 1
            and weights[0].device.type != "meta")


def _fuse(module: nn.Module, names: tuple, attr: str) -> bool:
    linears = [getattr(module, name, None) for name in names]
    if getattr(module, attr, None) is not None:
        return False
    from . import fp8_weights

    fp8 = fp8_weights.stackable(linears)  # 0810: FP8 layers, stacked with their scale grids
    if fp8 or _plain(linears):
        weights, biases, shards = [layer.weight for layer in linears], [layer.bias for layer in linears], False
    else:
        local = _column_shards(linears) if shards_on() else None
        if local is None:
            return False
        weights, biases, shards = [w for w, _ in local], [b for _, b in local], True
    with torch.no_grad():
        weight = torch.cat(weights, dim=0)
        bias = None if biases[0] is None else torch.cat(biases, dim=0)
        sizes = [w.shape[0] for w in weights]
        start = 0
        for layer, size in zip(linears, sizes):  # the originals become views of their rows
            rows = slice(start, start + size)
            _keep_as_view(layer, "weight", weight[rows], shards)
            if bias is not None:
                _keep_as_view(layer, "bias", bias[rows], shards)
            start += size
    scales = fp8_weights.stack_scales(linears) if fp8 else None
    setattr(module, attr, (weight, bias, sizes, shards, scales))
    FUSED.add(module)
    return True


def _keep_as_view(layer: nn.Linear, name: str, view: torch.Tensor, shard: bool) -> None:
    """Point the layer's parameter at `view` (for a column shard: a DTensor of it, same layout)."""
    param = getattr(layer, name)
    if not shard:
        param.data = view
        return
    from torch.distributed.tensor import DTensor

    dtensor = DTensor.from_local(view, param.device_mesh, param.placements, run_check=False, shape=param.shape,
                                 stride=param.stride())
    layer._parameters[name] = nn.Parameter(dtensor, requires_grad=param.requires_grad)


def after_load(model: nn.Module) -> None:
    """The model-loaded hook: with the knob on, fuse every GLM-4.5 attention's q/k/v and every
    MLP's gate/up weights that are plain layers (`_plain`) or tensor-parallel column shards
    (`_column_shards`, fused on each rank's own rows, with PB_FUSED_PROJ_TP on)."""
    if not on():
        return
    from ...models.glm4_moe.modeling_glm4_moe import Glm4MoeAttention, Glm4MoeMLP

    attention = mlps = skipped = shards = fp8 = 0
    for module in model.modules():
        if isinstance(module, Glm4MoeAttention):
            fused = _fuse(module, QKV, "pb_qkv")
            attention += fused
        elif isinstance(module, Glm4MoeMLP):
            fused = _fuse(module, GATE_UP, "pb_gate_up")
            mlps += fused
        else:
            continue
        skipped += not fused
        done = getattr(module, "pb_qkv", None) or getattr(module, "pb_gate_up", None)
        shards += fused and done[3]
        fp8 += fused and done[4] is not None
    local = f", {shards} of them tensor-parallel column shards fused on this rank's rows" if shards else ""
    local += f", {fp8} of them FP8 layers stacked as one float8 weight (0810)" if fp8 else ""
    sys.stderr.write(f"patchbay: PB_FUSED_PROJ: fused q/k/v in {attention} attention layers and gate/up in {mlps} "
                     f"MLPs{local} ({skipped} left as they are: neither plain Linear nor FP8 layers nor tensor-parallel "
                     f"column shards)\n")


def restore() -> None:
    """Run the separate projections again (their weights stay views of the fused rows)."""
    for module in list(FUSED):
        module.pb_qkv = module.pb_gate_up = None
    FUSED.clear()


def _usable(fused, x: torch.Tensor) -> bool:
    """A fused weight applies to x: always for plain layers; for column shards, as the layers'
    own inference path would run them, on a plain (replicated) input without autograd."""
    return fused is not None and (not fused[3] or (type(x) is torch.Tensor and not torch.is_grad_enabled()))


def _product(fused, x: torch.Tensor) -> torch.Tensor | None:
    """x times the fused weight (None: run the layers one by one)."""
    if not _usable(fused, x):
        return None
    weight, bias, _, _, scales = fused
    if scales is not None:
        from . import fp8_weights

        return fp8_weights.fused_product(x, weight, bias, scales)
    return F.linear(x, weight, bias)


def qkv(attn: nn.Module, hidden_states: torch.Tensor, hidden_shape: tuple):
    """The attention's query, key and value states, shaped [..., heads, head_dim] (this rank's
    heads under tensor parallelism)."""
    fused = getattr(attn, "pb_qkv", None)
    out = _product(fused, hidden_states)
    if out is None:
        return (attn.q_proj(hidden_states).view(hidden_shape), attn.k_proj(hidden_states).view(hidden_shape),
                attn.v_proj(hidden_states).view(hidden_shape))
    q, k, v = out.split(fused[2], dim=-1)
    return q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)


def mlp(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Glm4MoeMLP's output: down(act(gate(x)) * up(x))."""
    fused = getattr(module, "pb_gate_up", None)
    out = _product(fused, x)
    if out is None:
        return module.down_proj(module.act_fn(module.gate_proj(x)) * module.up_proj(x))
    gate, up = out.split(fused[2], dim=-1)
    return module.down_proj(module.act_fn(gate) * up)

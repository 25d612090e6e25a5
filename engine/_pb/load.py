"""The model-load sequence, defined once: what the patches that decide at model load do, in order.

Upstream's model manager calls two hooks (added by 0010): `before(model_kwargs)` before the
weights load and `after(model)` once they are loaded. patchbay's GPU tools, which build a model
in memory instead of loading a checkpoint, call the same two, so a tool and a server take the
same steps in the same order. Each step does nothing while its patch's knob is off.

A patch that needs a step at model load adds it to one of the lists below (and names this file
under its Modules); nothing else calls these modules' hooks.
"""

from __future__ import annotations

from .ops import fused_moe, fused_norm, fused_proj, fused_rope, fused_router, invariant_gemm, moe_combine
from .ops import fp8_weights, kv_fp8, moe_gate, moe_one_path, stable_launch, varlen_attention
from .runtime import kv_sizing, tp

# model_kwargs(kwargs) -> kwargs: the arguments the weights are loaded with (0200 TP plan, 0220 experts)
KWARGS = (tp, fused_moe)
# at_load(): swap in a forward or an operation before the weights load, knob read here
AT_LOAD = (fused_router, fused_rope, fused_norm, moe_combine, moe_gate, varlen_attention, invariant_gemm,
           moe_one_path, stable_launch, fp8_weights, kv_fp8, kv_sizing)
# after_load(model): index FP8 weights and shards (0810; 0310 stacks FP8 layers by that index), rearrange
# the loaded weights (0310), compile kernels on dummy steps (0450)
AFTER_LOAD = (fp8_weights, fused_proj, stable_launch)


def before(model_kwargs: dict) -> dict:
    """Before the weights load: the load arguments, then every at-load swap."""
    for module in KWARGS:
        model_kwargs = module.model_kwargs(model_kwargs)
    for module in AT_LOAD:
        module.at_load()
    return model_kwargs


def after(model) -> None:
    """Once the weights are loaded."""
    for module in AFTER_LOAD:
        module.after_load(model)


def restore() -> None:
    """Undo every swap `before` and `after` made (an in-process A/B switches knobs between settings)."""
    for module in dict.fromkeys(AT_LOAD + AFTER_LOAD):
        module.restore()

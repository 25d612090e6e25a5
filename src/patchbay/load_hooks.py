"""The engine's model-load hooks, for tools that build a model without the server's loader.

Some patches decide once, when the server loads a model, whether a modeling class takes
their fused forward (their knob on) or keeps upstream's: `at_load()` before the weights load,
`after_load(model)` once they are loaded. `transformers serve` calls them from its model
manager; patchbay's GPU tools build air12 in memory instead, so they call the same hooks
here. A pristine engine, or a build before a patch, lacks the module, and that hook is
skipped.
"""

from __future__ import annotations

import importlib

# engine modules (transformers._pb.NAME) with at_load() and/or after_load(model), and restore(), in the
# loader's order
HOOKS = ("fused_router", "fused_rope", "fused_norm", "moe_combine", "moe_gate", "varlen_attention", "invariant_gemm",
         "moe_one_path", "stable_launch", "fused_proj")


def modules() -> list:
    found = []
    for name in HOOKS:
        try:
            found.append(importlib.import_module(f"transformers._pb.{name}"))
        except ImportError:
            continue
    return found


def apply(model=None) -> None:
    """What a model load does: each hook whose knob is on installs its forward, and, given the
    loaded model, each after-load hook whose knob is on rearranges its weights."""
    for module in modules():
        if hasattr(module, "at_load"):
            module.at_load()
        if model is not None and hasattr(module, "after_load"):
            module.after_load(model)


def restore() -> None:
    """Undo `apply` (the in-process A/B switches knobs between settings)."""
    for module in modules():
        module.restore()

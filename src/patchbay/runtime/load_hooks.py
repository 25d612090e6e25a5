"""The engine's model-load sequence, for tools that build a model without the server's loader.

Some patches decide once, when the server loads a model, whether a modeling class takes their
fused forward (their knob on) or keeps upstream's. The engine defines that sequence once, in
`transformers._pb.load` (engine/_pb/load.py): `before(kwargs)` before the weights load,
`after(model)` once they are. `transformers serve` calls it from its model manager; patchbay's
GPU tools build air12 in memory instead and call it here. A pristine engine has no such
module, and then nothing happens.
"""

from __future__ import annotations

import importlib


def sequence():
    """The engine's load module, or None for the pristine engine."""
    try:
        return importlib.import_module("transformers._pb.load")
    except ImportError:
        return None


def apply(model=None) -> dict:
    """What a model load does: the load arguments the knobs choose (returned, e.g. 0220's
    experts_implementation), every at-load swap, and, given the loaded model, every after-load step."""
    load = sequence()
    if load is None:
        return {}
    kwargs = load.before({})
    if model is not None:
        load.after(model)
    return kwargs


def restore() -> None:
    """Undo `apply` (the in-process A/B switches knobs between settings)."""
    load = sequence()
    if load is not None:
        load.restore()

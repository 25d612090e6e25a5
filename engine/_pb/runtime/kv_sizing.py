"""PB_KV_SIZING: the paged KV pool sized for the attention that runs (0370's kernels), not for sdpa's.

Upstream sizes the pool from the memory left after the weights (times its max_memory_percent),
less what it expects a step to hold beside the cache. For sdpa it expects two things that 0370's
varlen kernels do not have: a block-diagonal mask of [max batch tokens, every cache token + max
batch tokens] for each of async batching's two input/output pairs, which the batching loop also
allocates and (0240) fills on the device every step; and a step's keys and values read back with
the KV heads repeated to the query heads. For GLM-4.5-Air's shapes (96 query heads over 8 KV
heads of 128, 8,192 batch tokens) that charges 32 KiB of masks and 50 KiB of repeated keys and
values for each cache token, where the token's own keys and values take 4 KiB a layer: on one
H100 with air12 in bf16 the pool got 729 pages of 256 tokens out of 25 GB free, and the masks
held 6.4 GB that nothing read (W60).

With the knob on, where 0370's kernels take every paged step of the model (0370 on, on a GPU
or under Triton's interpreter, every layer full attention, the head shapes the kernels take
(varlen_attention.heads_fit), the sdpa integration), the batching loop allocates no mask and
builds none, and the sizing charges what attention that reads KV heads as stored costs (upstream's figures for
flash attention). Everything else is upstream's, its max_memory_percent margin included. Where
the kernels would not take every step the knob changes nothing and the log says why. Should a
paged step ever reach sdpa's own path without a mask, it fails (`no_mask`) instead of attending
over the whole step as one causal sequence.

Nothing a step computes changes (the kernels read no mask), only the pool's size and the masks'
memory and fills.
"""

import sys

import torch

from .. import knobs
from ..ops.common import INTERPRET

ENABLED = False  # set by at_load: the knob on when the model was loaded
_said = False  # the decision is logged once


def on() -> bool:
    return bool(knobs.get("PB_KV_SIZING"))


def why_not(config) -> str | None:
    """Why 0370's kernels would not take every paged step of a model of `config`, or None when
    they would (so it needs no mask)."""
    from ..ops import varlen_attention

    if not varlen_attention.ENABLED:
        return "0370's kernels are off (PB_VARLEN_ATTENTION, or no Triton here)"
    if not (INTERPRET or torch.cuda.is_available()):
        return "0370's kernels run on a GPU (or under Triton's interpreter), and this machine has none"
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return f"the attention implementation is {getattr(config, '_attn_implementation', None)!r}, not sdpa"
    if getattr(config, "sliding_window", None) is not None or any(
            t != "full_attention" for t in (getattr(config, "layer_types", None) or ())):
        return "some layers use a sliding window"
    heads = getattr(config, "num_attention_heads", 0)
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    dim = getattr(config, "head_dim", None) or (config.hidden_size // heads if heads else 0)
    if not varlen_attention.heads_fit(dim, heads, kv_heads):
        return f"head size {dim} with {heads} heads over {kv_heads} KV heads is not a shape the kernels take"
    return None


def maskless(config, log: bool = False) -> bool:
    """With the knob on: whether a model of `config` runs without attention masks (why_not is None).
    `log`: say the decision once (the memory handler asks when the pool is sized)."""
    global _said
    if not ENABLED:
        return False
    reason = why_not(config)
    if log and not _said:
        _said = True
        if reason is None:
            sys.stderr.write("patchbay: PB_KV_SIZING: no attention masks; the KV pool is sized for keys and values "
                             "read as stored\n")
        else:
            sys.stderr.write(f"patchbay: PB_KV_SIZING is on but changes nothing: {reason}\n")
    return reason is None


def no_mask(config) -> None:
    """Called where a paged step reaches sdpa's own path (0370 did not take it): with no masks
    allocated that path would attend over the whole step as one causal sequence, so it fails."""
    if maskless(config):
        raise RuntimeError("PB_KV_SIZING: a paged attention step reached sdpa's own path, but no attention mask "
                           "was allocated (0370's kernels were expected to take every step); turn PB_KV_SIZING off "
                           "for this model")


def at_load() -> None:
    global ENABLED
    ENABLED = on()


def restore() -> None:
    global ENABLED, _said
    ENABLED = _said = False

"""PB_CAUSAL_PREFILL: a lone fresh prompt's step uses sdpa's causal kernel, not a mask.

With sdpa, upstream's batching gives every step an explicit additive mask over [query, key]
(block-diagonal over the step's sequences), so the attention kernel reads the mask and
computes the whole square; on a cold 8K-token prompt that is 8K x 8K per layer. When the
step is one sequence with nothing cached before it (a fresh prompt, or its first chunk), the
mask is exactly the causal triangle: padded query rows and keys come after the real ones, so
no real row sees them. sdpa's own `is_causal` then gives the same attention with a kernel
that skips the upper triangle and reads no mask (flash or cuDNN on a GPU). Such a step gets
no mask and `is_causal=True`, the mask region is not built (on the host, or on the device
under 0240), and under CUDA graphs it gets a graph of its own. Every other step is upstream's.

The model's own `create_causal_mask` would undo that under CUDA graphs: given no mask, it
looks for packed sequences in the position ids, and while a stream is being captured it cannot
read them on the host, so it builds an explicit mask anyway (on an H200, W08: the steps were
marked causal, yet their attention took as long as the masked square, 126 against 122 ms for 8K
tokens in 12 layers, where sdpa alone takes 2.6 ms a layer causal against 9.5 masked). So a
causal step also carries `pb_causal_step`, and the sdpa attention drops whatever mask the model
built for such a step (`step_mask`). `STEPS` counts the marks.
"""

from .. import knobs


def on() -> bool:
    return bool(knobs.get("PB_CAUSAL_PREFILL"))


# Steps marked while the knob is on: "causal", or "not: <the first condition that failed>"
# (profiles read it to show whether a prompt took the causal kernel).
STEPS: dict = {}


def _conditions(io) -> dict:
    """What makes the step an IO has just prepared a lone fresh prompt under sdpa, each checked."""
    from ...generation.continuous_batching.cache_allocators import FULL_ATTENTION

    return {"a mask": io.attention_mask is not None, "no block table": not io.use_block_table,
            "one sequence": io.num_request_in_batch == 1, "nothing cached": io.max_kv_read == 0,
            "more than one query token": io.total_seqlen_q > 1,
            "sdpa": getattr(io.config, "_attn_implementation", None) == "sdpa",
            "full attention only": set(io.cumulative_seqlens_k) == {FULL_ATTENTION}}


def mark(io) -> None:
    """Called once the step is prepared (its lengths known, its mask not yet built)."""
    io._pb_causal = False
    if not on():
        return
    failed = [name for name, ok in _conditions(io).items() if not ok]
    io._pb_causal = not failed
    key = f"not: {failed[0]}" if failed else "causal"
    STEPS[key] = STEPS.get(key, 0) + 1


def causal(io) -> bool:
    return getattr(io, "_pb_causal", False)


def carry(host, device) -> None:
    """The host-to-device transfer of async batching carries the choice with the lengths."""
    device._pb_causal = causal(host)


def model_kwargs(io, kwargs) -> None:
    if causal(io):
        kwargs["attention_mask"] = None
        kwargs["is_causal"] = True
        kwargs["pb_causal_step"] = True


def step_mask(attention_mask, kwargs: dict):
    """The mask sdpa gets: none on a causal step (whatever the model built), else the model's."""
    return None if kwargs.get("pb_causal_step") else attention_mask


def graph_key(io, key: tuple) -> tuple:
    """A causal step replays a graph of its own: the same shapes with a mask are another graph."""
    return (*key, "causal") if causal(io) else key

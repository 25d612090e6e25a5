"""PB_DECODE_GRAPHS: one CUDA graph for each batch size, whatever the contexts' lengths.

On the varlen path a step's graph is keyed by its padded query tokens, the KV tokens it reads
and its longest key (0230 rounds the reads to a quarter of an octave, the longest key to a power
of two). A decode step's reads grow by one token a stream every step, so its key moves to a new
bucket every few dozen steps: a 1,024-token reply at 64 streams crossed about 20 of them on an
H100 (W72's served log), and each new key is captured on both IO pairs, an eager forward and a
capture of 60-90 ms that holds every stream.

With this project's attention (0370's kernels reading the cache's pages, 0750; no mask, 0850)
nothing a decode step computes depends on those two sizes: the kernels walk each row's own keys
from the cumulative lengths, the decode grid is fixed (0740), and the read index past the step's
own entries is never read. So with the knob at 1, a step whose every request brings one query
token pads its KV reads to the cache's whole read capacity and its longest key to the same cap:
the decode graphs are one a query bucket. The same holds of the prompt kernel, which walks each
sequence's keys from the same lengths: at 2, every step that reads cached keys (a prompt chunk
beside decode rows, a prompt after its cached prefix, drafted rows) pads so, and a step's graph
depends on its query tokens alone (steps that read no cache keep their own). The same kernels
read the same rows, so a reply keeps its bits. What the wider padding would cost is kept out:
the asynchronous copy carries only the step's own read indices (`copied`), and 0740's part
buffers are bounded by the rows as well as by the keys (varlen_attention._decode_in_parts).

It applies only where all of that holds, checked once a model runner (`_fits`): padded step
shapes (CUDA graphs, or compile), 0370 with 0750 reading the cache, every cache group full
attention with no mask, and a 16-bit cache. Elsewhere (a sliding window, upstream's gather of
every key read, 0830's gather of the prompt rows) a wider read would cost a wider gather, and
the step keeps 0230's buckets.
Hooks: where the batching loop pads a step's sizes, where a step pads its longest key, and
0240's copy of the read indices.
"""

import sys

from .. import knobs


def on() -> int:
    """0: off; 1: steps of decode rows alone; 2: every step that reads cached keys."""
    return int(knobs.get("PB_DECODE_GRAPHS") or 0)


def why_not(model_runner) -> str | None:
    """Why this runner's steps keep 0230's buckets, or None when the knob applies."""
    from ...generation.continuous_batching.cache_allocators import FULL_ATTENTION
    from ..ops import varlen_attention

    if not model_runner.pad_inputs:
        return "steps are not padded (neither CUDA graphs nor compile is on)"
    if not varlen_attention.READ_CACHE:
        return "PB_VARLEN_ATTENTION with PB_CACHE_READ (0370, 0750) does not read this model's cache"
    cache = model_runner.cache
    if any(name != FULL_ATTENTION for name in cache.cache_allocators):
        return "a cache group is not full attention (a sliding window)"
    if any(getattr(a, "_pb_kv_scales", None) is not None for a in cache.cache_allocators.values()):
        return "the cache is 8-bit (0830, 0840): its prompt rows are gathered at the step's padded width"
    if getattr(model_runner.inputs_and_outputs, "attention_mask", None) is not None or _masked(model_runner):
        return "steps build attention masks (PB_KV_SIZING, 0850, allocates none)"
    return None


def _masked(model_runner) -> bool:
    pairs = getattr(model_runner.inputs_and_outputs, "io_pairs", None)
    return any(p.host_io.attention_mask is not None for p in pairs or ())


def _fits(model_runner) -> bool:
    """why_not, asked once a runner (it says its answer once)."""
    fits = getattr(model_runner, "_pb_decode_graphs", None)
    if fits is None:
        reason = why_not(model_runner)
        fits = model_runner._pb_decode_graphs = reason is None
        sys.stderr.write("patchbay: PB_DECODE_GRAPHS: " + (
            ("decode steps" if on() == 1 else "steps that read the cache")
            + " read the cache's whole KV width under one graph a batch size\n" if reason is None
            else f"steps keep their KV buckets: {reason}\n"))
    return fits


def pad(model_runner, requests: int, num_q_tokens: int, max_kv_read: int, use_decode_fast_path: bool):
    """The step's padded (query tokens, KV tokens read): upstream's / 0230's padding, and with the
    knob at 1 a step of one query token a request, at 2 any step that reads cached keys, reads the
    cache's whole KV width."""
    level, rows = on(), num_q_tokens
    num_q_tokens, max_kv_read = model_runner.maybe_pad_inputs(num_q_tokens, max_kv_read, use_decode_fast_path)
    if (level and not use_decode_fast_path and max_kv_read > 0 and (level > 1 or rows == requests)
            and _fits(model_runner)):
        max_kv_read = model_runner.cache.max_tokens_read
    return num_q_tokens, max_kv_read


def wide(io) -> bool:
    """Whether this IO's step reads the cache's whole KV width (padded so under the knob)."""
    return bool(on()) and 0 < io.max_kv_read and io.max_kv_read >= io.cache.max_tokens_read


def longest_key(io) -> None:
    """After upstream pads the longest key to a power of two: a wide step's is the cap, so its graph
    key no longer moves with the contexts (the kernels read none of it)."""
    if wide(io):
        for layer_type in io.max_length_k:
            io.max_length_k[layer_type] = io.cache.max_tokens_read


def copied(host, padded: int) -> int:
    """How many read indices a step's asynchronous copy carries: a wide step's own (its entries past
    them are never read), otherwise the padded count as before."""
    if not wide(host):
        return padded
    return min(padded, max(host.true_read_sizes))

"""PB_GRAPH_MAX_Q: CUDA graphs only for steps of at most N query tokens; larger steps run
their forward eagerly.

Upstream captures a graph the first time a padded step shape comes and keeps it. On the varlen
path the shape is (query tokens, KV tokens read, longest key), and 0230's buckets keep each of
them near the batch's own size, so a step that carries a prompt chunk next to decoding streams
brings a new shape for nearly every mix of chunk and contexts. Under 32 agent streams on an
H200 (W27) the server held more graphs every few seconds for minutes (47 when the 32-stream
passes began, 166 three minutes later), and each capture (an eager forward, then the capture)
holds every stream for that step. A step with a prompt chunk is long next to its kernel
launches, and a decode step short: with the knob at N, a step of more than N query tokens
(after padding) runs the same forward on the same padded inputs without a graph, and the
graphs left are the decode shapes, which repeat. The same kernels see the same inputs either
way: the same bits.
"""

from .. import knobs


def graphed(query_tokens: int) -> bool:
    """Whether a step of `query_tokens` (padded) may replay or capture a CUDA graph."""
    limit = knobs.get("PB_GRAPH_MAX_Q")
    return not limit or query_tokens <= limit

"""PB_GRAPH_AFTER: a step shape gets its CUDA graph when it comes back, not the first time.

Upstream captures a graph the first time a padded step shape comes and keeps it. On the varlen
path the shape is (query tokens, KV tokens read, longest key), and a step that carries a prompt
chunk next to decoding streams brings a new one for nearly every mix of chunk and contexts:
under 32 agent streams on an H200 the server captured 44 graphs during W28's measured passes
(47 -> 166 over three minutes in W27), each capture (an eager forward, then the capture) holding
every stream for that step. 0680's limit on query tokens stops those captures but runs every
prompt step eagerly, and a lone agent's first token came 1.5-1.7x as late (W28). With the knob
at N, a shape without a graph runs its forward eagerly its first N times and is captured the
time after: the same forward on the same padded inputs, so the same bits (W28 checked eager ==
replayed on the GPU). Shapes that come once never cost a capture; shapes that come back (decode
steps, a lone prompt of a usual length) are replayed as before after N eager steps. 0 keeps
upstream's behaviour. Each IO pair keeps its own graphs, so it keeps its own counts.
Hook: one condition where the model runner chooses between a graph and the eager forward.
"""

from .. import knobs

# Shapes seen but not yet captured, at most this many a pair: past it the counts start over,
# so a server that met many one-off shapes does not keep them all.
MAX_TRACKED = 4096


def _device_io(ios):
    """The device-side IO that holds this step's graphs: the current pair's with async batching."""
    pairs = getattr(ios, "io_pairs", None)
    return ios if pairs is None else pairs[ios.current_pair].device_io


def graphed(ios) -> bool:
    """Whether this step may replay or capture a CUDA graph: always with the knob at 0; with it at
    N, when the step's shape has a graph already or has run eagerly N times before."""
    after = knobs.get("PB_GRAPH_AFTER")
    if not after:
        return True
    io = _device_io(ios)
    key = io._get_graph_key()
    if io.graphs.get_graph(key) is not None:
        return True
    seen = io.__dict__.setdefault("_pb_graph_sightings", {})
    count = seen.get(key, 0)
    if count >= after:
        del seen[key]
        return True
    if len(seen) >= MAX_TRACKED:
        seen.clear()
    seen[key] = count + 1
    return False

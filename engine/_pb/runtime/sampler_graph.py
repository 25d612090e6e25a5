"""PB_SAMPLER_GRAPH: the batched sampler's draw (0630) replayed from CUDA graphs.

The draw is some fifty small kernels (temperature, a sort, softmax, the cuts, the hash that
gives the race its noise, argmax), and at one row each costs more to launch from Python than
to run: about 0.6 ms of a 5 ms decode step. Here the draw of each size of chunk (1, 2, 4, 8
or 16 rows, a chunk padded up to the next) and each mix of the ways its rows draw
(batched_sampler.KINDS) is captured once in a CUDA graph over fixed buffers; a step copies its
rows' scores and settings in and replays it. The graph runs the very kernels the eager draw
runs, row by row, so a row's token is the same bits with or without it, alone or batched
(padding rows are computed and dropped). A server with the knob on captures them all before its KV pool is sized
(about 0.2 GB on GLM's vocabulary); one that captures later, for a request that turned the knob
on, takes their memory from the pool's margin. If a capture fails, the server logs it once and
keeps drawing eagerly.
"""

import logging

import torch

from .. import knobs

logger = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16)  # the batched sampler's CHUNK is the largest
_graphs: dict = {}  # (device, bucket, vocab, kind) -> _Captured
_pool = None  # one memory pool for all of them: they never run at the same time
_failed = False


class _Captured:
    def __init__(self, graph, scores, params, picks):
        self.graph, self.scores, self.params, self.picks = graph, scores, params, picks


def on() -> bool:
    return bool(knobs.get("PB_SAMPLER_GRAPH"))


def usable(scores: torch.Tensor) -> bool:
    return scores.is_cuda and not _failed and not torch.cuda.is_current_stream_capturing()


def _capture(device, bucket: int, vocab: int, kind: str) -> _Captured:
    global _pool
    from .batched_sampler import race

    scores = torch.zeros(bucket, vocab, device=device)
    # Rows of settings: temperature 1, nothing cut, key 0, the first way; padding keeps them.
    params = torch.tensor([[1.0, float(vocab), 1.0, 0.0, 0.0, 0.0]] * bucket, dtype=torch.float64, device=device)
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        race(scores, params.t(), kind)  # lazy initialisations (the sort's workspace) outside the capture
    torch.cuda.current_stream(device).wait_stream(side)
    if _pool is None:
        _pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=_pool, capture_error_mode="thread_local"):
        picks = race(scores, params.t(), kind)
    return _Captured(graph, scores, params, picks)


def _graph_for(device, bucket: int, vocab: int, kind: str) -> _Captured | None:
    """The captured draw of this size and mix, captured now if it is not yet; None when a capture
    failed (the server then draws eagerly from then on)."""
    global _failed
    key = (device, bucket, vocab, kind)
    if key not in _graphs and not _failed:
        try:
            _graphs[key] = _capture(device, bucket, vocab, kind)
        except Exception as e:  # keep serving: the eager draw gives the same tokens
            _failed = True
            logger.warning("patchbay: PB_SAMPLER_GRAPH could not capture the sampler (%s: %s); drawing eagerly",
                           type(e).__name__, str(e).splitlines()[0][:200] if str(e) else "")
    return _graphs.get(key)


def reserve(model) -> None:
    """At start, before the KV pool is sized from the memory left: capture every graph, so the
    pool leaves their memory alone (a graph's memory is its own; captured later, it came out of
    the margin the pool left for the step's temporaries, and a C32 step ran out of memory)."""
    if not on() or model.device.type != "cuda":
        return
    vocab = model.config.get_text_config().vocab_size
    from .batched_sampler import KINDS

    for bucket in BUCKETS:
        for kind in KINDS:
            _graph_for(model.device, bucket, vocab, kind)


def race(scores: torch.Tensor, params: list, kind: str) -> torch.Tensor:
    """batched_sampler.race for a chunk of at most 16 rows: scores [rows, vocab] on the GPU,
    `params` the six lists of the rows' settings (batched_sampler._sample's)."""
    rows, vocab = scores.shape
    captured = _graph_for(scores.device, next(b for b in BUCKETS if b >= rows), vocab, kind)
    if captured is None:
        from .batched_sampler import race as eager

        return eager(scores, torch.tensor(params, dtype=torch.float64).to(scores.device), kind)
    captured.scores[:rows].copy_(scores)
    captured.params[:rows].copy_(torch.tensor(params, dtype=torch.float64).t(), non_blocking=True)
    captured.graph.replay()
    return captured.picks[:rows].clone()

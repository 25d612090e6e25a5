"""PB_GRAPH_SAMPLING: per-request token choice on a server that captures CUDA graphs.

A captured graph replays its kernels without Python, so the sampler's hook (0100) cannot
run inside it. But the logits a graph computes live in the graph's own memory, and every
replay writes the new ones into the same tensor. So: while a graph is captured, the hook
keeps a reference to its logits tensor; right after each replay, on the same stream, the
rows of requests with their own settings are chosen again from those logits and written
into the output the graph just filled, before anything reads it. Requests without their
own settings keep the graph's tokens. The host waits for the step's logits only when such
a request is in the batch.

PB_GRAPH_LOGITS: the logits a capture leaves behind are then held for the server's life, one
tensor per graph. A prompt-sized graph's are [1024, vocab] float32 (upstream pads a graph's
sequences to min(query tokens, max_requests_per_batch)): 592 MiB on GLM's vocabulary, that
later captures cannot reuse. With the knob on, each capture after the first copies its logits
into one buffer all graphs share (one stream replays them one at a time, and a replay's rows are
chosen again before the next replay starts), so the graph's own logits go back to the pool.
"""

import torch

from .. import knobs

_captured: dict = {}  # id(graph) -> the logits tensor its replays overwrite
_pending = []
_shared: dict = {}  # device -> PB_GRAPH_LOGITS's [rows, vocab] buffer for every graph's logits
SHARED_ROWS = 1024  # at least: upstream's default max_requests_per_batch, the most a graph pads to


def on() -> bool:
    return bool(knobs.get("PB_GRAPH_SAMPLING"))


def shared() -> bool:
    return bool(knobs.get("PB_GRAPH_LOGITS"))


def note_capture(logits: torch.Tensor) -> None:
    """Inside the captured forward: remember the tensor its replays will write (with
    PB_GRAPH_LOGITS, a view of the shared buffer the graph then copies them into)."""
    if logits.is_cuda and torch.cuda.is_current_stream_capturing() and on():
        into = _shared_view(logits) if shared() else None
        if into is not None:
            into.copy_(logits)  # captured: every replay copies its logits there
            logits = into
        _pending.append(logits)


def _shared_view(logits: torch.Tensor) -> torch.Tensor | None:
    """The shared buffer's first rows in the logits' shape; None before there is one big enough."""
    buf = _shared.get(logits.device)
    vocab = logits.shape[-1]
    rows = logits.numel() // vocab if vocab else 0
    if buf is None or buf.dtype != logits.dtype or buf.shape[1] != vocab or buf.shape[0] < rows:
        return None
    return buf[:rows].view(logits.shape)


def captured(graph) -> None:
    """After a capture: tie the logits just noted to the graph that owns them. With
    PB_GRAPH_LOGITS, make the shared buffer (outside any capture) when this graph's logits had to
    be its own, so that the captures after it copy theirs into it."""
    if _pending and graph is not None:
        logits = _pending[-1]
        _captured[id(graph)] = logits
        if shared() and _shared_view(logits) is None:
            vocab = logits.shape[-1]
            rows = max(SHARED_ROWS, logits.numel() // vocab)
            # a smaller buffer it replaces stays alive through the views earlier graphs hold
            _shared[logits.device] = torch.empty((rows, vocab), dtype=logits.dtype, device=logits.device)
    _pending.clear()


def replayed(runner, graph, output_ids) -> None:
    """After a replay: choose again for the rows whose requests have their own settings."""
    if not on():
        return
    from . import sampler, tp

    logits = _captured.get(id(graph))
    if logits is not None:
        sampler._override(runner, logits, output_ids)
    tp.sync_tokens(output_ids)  # rank 0's choice reaches every rank (a no-op on one)

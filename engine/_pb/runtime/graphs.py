"""PB_GRAPH_SAMPLING: per-request token choice on a server that captures CUDA graphs.

A captured graph replays its kernels without Python, so the sampler's hook (0100) cannot
run inside it. But the logits a graph computes live in the graph's own memory, and every
replay writes the new ones into the same tensor. So: while a graph is captured, the hook
keeps a reference to its logits tensor; right after each replay, on the same stream, the
rows of requests with their own settings are chosen again from those logits and written
into the output the graph just filled, before anything reads it. Requests without their
own settings keep the graph's tokens. The host waits for the step's logits only when such
a request is in the batch.
"""

import torch

from .. import knobs

_captured: dict = {}  # id(graph) -> the logits tensor its replays overwrite
_pending = []


def on() -> bool:
    return bool(knobs.get("PB_GRAPH_SAMPLING"))


def note_capture(logits: torch.Tensor) -> None:
    """Inside the captured forward: remember the tensor its replays will write."""
    if logits.is_cuda and torch.cuda.is_current_stream_capturing() and on():
        _pending.append(logits)


def captured(graph) -> None:
    """After a capture: tie the logits just noted to the graph that owns them."""
    if _pending and graph is not None:
        _captured[id(graph)] = _pending[-1]
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

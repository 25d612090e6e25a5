"""PB_GRAMMAR_OVERLAP: a step's grammar masks filled together while the GPU computes the step.

Without it each constrained row of a step, in turn, advanced its grammar, filled its
next-token bitmask on the host and copied it to the GPU with a wait, so the host sat idle
until the forward pass ended and then filled the next row's mask while the GPU sat idle.
Here, before the batched sampler (0630) puts any work on the GPU, every constrained row's
grammar is advanced and the step's bitmasks are filled together by xgrammar's own threads
into one pinned buffer; one copy takes them to the device behind the forward pass, and each
row's mask applies its row of it. The host never waits in between; the masks are the same
bits, so the replies are too.
"""

import torch

from .. import knobs

_batch = None  # xgrammar's BatchGrammarMatcher: its threads fill the rows
_buffers: dict = {}  # (device, words) -> two host buffers used in turn
_turn = 0


def on() -> bool:
    return bool(knobs.get("PB_GRAMMAR_OVERLAP"))


def constraint_of(mask):
    """The grammar constraint behind a Spec's mask (0150's budget wraps one), or None."""
    inner = getattr(mask, "inner", mask)
    return inner if hasattr(inner, "needs_bitmask") else None


def _host_buffer(device: torch.device, rows: int, words: int) -> torch.Tensor:
    """A host buffer of at least `rows` rows. Pinned for a GPU, so the copy does not wait; two of
    them in turn, so a step never writes into the one the previous step's copy reads (the
    previous step's wait for its constrained rows' tokens also followed that copy)."""
    global _turn
    key = (device.type, words)
    pair = _buffers.get(key)
    if pair is None or pair[0].shape[0] < rows:
        size = max(rows, 2 * (pair[0].shape[0] if pair else 8))
        pin = device.type == "cuda"
        pair = [torch.empty(size, words, dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        _buffers[key] = pair
    _turn ^= 1
    return pair[_turn]


def prepare(rows, device: torch.device) -> None:
    """Before the step's first GPU work: fill the bitmasks of the rows whose request has 0640."""
    global _batch
    wanted = []
    for spec in rows:
        if spec.mask is None or not getattr(spec, "overlap", False) or spec.forced is not None:
            continue
        constraint = constraint_of(spec.mask)
        if constraint is None:
            continue
        constraint.catch_up(spec)
        constraint.overlap, constraint.ready = True, None
        if constraint.needs_bitmask():
            wanted.append(constraint)
    if not wanted:
        return
    import xgrammar as xgr

    if _batch is None:
        _batch = xgr.BatchGrammarMatcher()
    words = xgr.get_bitmask_shape(1, wanted[0].vocab_size)[1]
    host = _host_buffer(device, len(wanted), words)[:len(wanted)]
    _batch.batch_fill_next_token_bitmask([c.matcher for c in wanted], host)
    on_device = host.to(device, non_blocking=True) if device.type == "cuda" else host.clone()
    for j, constraint in enumerate(wanted):  # rows as [1, words]: xgrammar's GPU kernel reads a 2-D mask
        constraint.ready = (constraint.seen, on_device[j:j + 1], host[j])

"""PB_GRAMMAR_OVERLAP: a step's grammar masks filled together while the GPU computes the step.

Without it each constrained row of a step, in turn, advanced its grammar, filled its
next-token bitmask on the host and copied it to the GPU with a wait, so the host sat idle
until the forward pass ended and then filled the next row's mask while the GPU sat idle.
Here, before the batched sampler (0630) puts any work on the GPU, every constrained row's
grammar is advanced and the step's bitmasks are filled together by xgrammar's own threads
into one pinned buffer (each row finished with the tokens its phase allows besides the
grammar, its forbidden ones cleared); one copy takes them to the device behind the forward
pass, and one kernel applies them all after the rows' masks ran. The host never waits in
between; the masks are the same bits, so the replies are too.
"""

import torch

from .. import knobs

_batch = None  # xgrammar's BatchGrammarMatcher: its threads fill the rows
_buffers: dict = {}  # (device, words) -> two host buffers used in turn
_turn = 0
_step = None  # (device bitmask [rows, words], rows) that `apply` masks in this step


def on() -> bool:
    return bool(knobs.get("PB_GRAMMAR_OVERLAP"))


def constraint_of(mask):
    """The grammar constraint behind a Spec's mask (0150's budget wraps one), or None."""
    inner = getattr(mask, "inner", mask)
    return inner if hasattr(inner, "needs_bitmask") else None


def _host_buffer(device: torch.device, rows: int, words: int) -> torch.Tensor:
    """A host buffer of at least `rows` rows. Pinned for a GPU, so the copy does not wait; two of
    them in turn, so a step never writes into the one the previous step's copy may still read
    (a step's copy is done once the next step has waited for that step's tokens, which follow it)."""
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
    """Before the step's first GPU work: fill the bitmasks of the rows (the step's free rows, in the
    order of their scores) whose request has 0640, each finished with its phase's extra and
    forbidden tokens, and send them to the device in one copy for `apply`."""
    global _batch, _step
    _step = None
    wanted, at = [], []
    for j, spec in enumerate(rows):
        if spec.mask is None or not spec.overlap:
            continue
        constraint = constraint_of(spec.mask)
        if constraint is None:
            continue
        constraint.catch_up(spec)
        constraint.overlap, constraint.ready = True, None
        if constraint.needs_bitmask():
            wanted.append(constraint)
            at.append(j)
    if not wanted:
        return
    import xgrammar as xgr

    if _batch is None:
        _batch = xgr.BatchGrammarMatcher()
    words = xgr.get_bitmask_shape(1, wanted[0].vocab_size)[1]
    host = _host_buffer(device, len(rows), words)[:len(rows)]
    _batch.batch_fill_next_token_bitmask([c.matcher for c in wanted], host, at)
    for constraint, j in zip(wanted, at):
        constraint.finish_row(host[j])
    on_device = host.to(device, non_blocking=True) if device.type == "cuda" else host.clone()
    for constraint, j in zip(wanted, at):
        constraint.ready = (constraint.seen, on_device[j:j + 1], host[j])
    _step = (on_device, at)


def apply(scores: torch.Tensor) -> None:
    """After the step's masks ran over `scores` [rows, vocab]: every prepared row's bitmask at once
    (their masks left it to this; xgrammar's kernel, one launch)."""
    global _step
    if _step is None:
        return
    import xgrammar as xgr

    on_device, at = _step
    _step = None
    xgr.apply_token_bitmask_inplace(scores, on_device, indices=at)

"""PB_SORT_FREE: the batched sampler's top-p and min-p without sorting the vocabulary.

0630 sorts each cut row's 151,552 logits to find where top-p ends. On an H200 the sort is most
of a sampled step's choice from 8 rows up (W23: 0.74 ms against 0.29 ms for rows that cut
nothing at 8 rows, 2.03 against 0.91 at 32), and the rest of the step has to wait for it.

Both cuts keep a prefix of the row's ranking (by logit, ties by token id): top-p the tokens
before which less than top_p of the mass lies, min-p those at least min_p times as likely as
the first. So the race (argmax of p / E, the batched sampler's counter-based noise) can run
over the whole row first; if its winner is inside the kept prefix it is the kept set's winner
too, as the kept set is a subset holding it. If not, every kept token ranks before it: the race
runs again over those alone, and so on. Each round is two passes over the row (the winner, then
the mass ranked before it); with top_p 0.95 a round ends the draw at least 95 % of the time.

On a GPU three Triton launches do it (ops/kernels/sort_free.py): the first round spread over
SPLIT programs a row (the parts' largest logit, sum and winner, then the parts' mass before the
row's winner), then one program a row keeps the winner or runs the further rounds over the whole
row. A row's token depends on its own logits, seed and position alone, and graphs capture it
(the loop is inside the last kernel). Elsewhere `reference` computes the same thing with torch,
its sums in float64; the two differ only where a winner's mass lands within a rounding of
top_p. A seeded reply is the same alone and batched on either.

Rows with top_k keep 0630's sort (the top-p mass is then the top k's). The race takes its log
form (x - log E) with the sort's noise, so a row draws the sort's token but where two tokens'
race values tie within a rounding, or a winner's mass lands within a rounding of top_p (W25:
676 rows of 676 the sort's on an H200).
"""

import torch

from .. import knobs
from ..ops.common import INTERPRET, TRITON, kernels

SPLIT = 16  # programs a row's first round is spread over (a power of two)
PART_BLOCK = 1024
BLOCK = 2048  # the later rounds' block: one program goes over the whole row
MAX_ROUNDS = 256  # a bound for rows no sane draw reaches (NaN-free rows need about log2(vocab))


def on() -> bool:
    return bool(knobs.get("PB_SORT_FREE"))


def race(scaled: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Token ids [rows] int64: scaled [rows, vocab] float32 (the scores over the temperature, -inf
    where masked), top_p and min_p [rows] float32, keys [rows] int64 (the rows' 32-bit keys)."""
    if TRITON and (scaled.is_cuda or INTERPRET):
        return kernel(scaled, top_p, min_p, keys)
    return reference(scaled, top_p, min_p, keys)


def kernel(scaled, top_p, min_p, keys) -> torch.Tensor:
    scaled = scaled.contiguous()
    rows, vocab = scaled.shape
    out = torch.empty(rows, dtype=torch.long, device=scaled.device)
    if rows:
        chunk = -(-vocab // SPLIT)
        parts = torch.empty(5, rows, SPLIT, dtype=torch.float32, device=scaled.device)
        k = kernels("sort_free")
        k.pb_sort_free_parts[(rows, SPLIT)](scaled, keys.contiguous(), parts, vocab, scaled.stride(0), chunk,
                                            SPLIT=SPLIT, BLOCK=PART_BLOCK, num_warps=4)
        k.pb_sort_free_mass[(rows, SPLIT)](scaled, parts, vocab, scaled.stride(0), chunk, SPLIT=SPLIT,
                                           BLOCK=PART_BLOCK, num_warps=4)
        k.pb_sort_free[(rows,)](scaled, top_p.float().contiguous(), min_p.float().contiguous(), keys.contiguous(),
                                parts, out, vocab, scaled.stride(0), SPLIT=SPLIT, BLOCK=BLOCK, MAX_ROUNDS=MAX_ROUNDS,
                                num_warps=8)
    return out


def reference(scaled, top_p, min_p, keys) -> torch.Tensor:
    """The kernel's draw in torch: round after round for the rows whose winner was cut."""
    from .batched_sampler import exponentials

    rows, vocab = scaled.shape
    ids = torch.arange(vocab, device=scaled.device)[None, :]
    noisy = scaled - torch.log(exponentials(keys[:, None], ids))
    top = scaled.max(dim=-1, keepdim=True).values
    shift = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    weights = torch.exp(scaled - shift).double()
    total = weights.sum(dim=-1)
    allowed = torch.ones_like(scaled, dtype=torch.bool)
    open_rows = ~((top[:, 0] == float("-inf")) | torch.isnan(total))
    picks = noisy.argmax(dim=-1)  # what a row of -inf or NaN gets
    for _ in range(MAX_ROUNDS):
        if not bool(open_rows.any()):
            break
        w = noisy.masked_fill(~allowed, float("-inf")).argmax(dim=-1)
        xw = scaled.gather(1, w[:, None])
        before = (scaled > xw) | ((scaled == xw) & (ids < w[:, None]))
        mass = (weights * before).sum(dim=-1)
        keep = (mass == 0) | (((top_p >= 1.0) | (mass < top_p.double() * total))
                              & (torch.exp(xw[:, 0] - shift[:, 0]) >= min_p))
        picks = torch.where(open_rows, w, picks)
        open_rows = open_rows & ~keep
        allowed = before
    return picks

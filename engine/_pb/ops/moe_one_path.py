"""PB_MOE_ONE_PATH: 0220's fused MoE kernels for steps of every size, so a token's experts give it
the same bits whether its step has 1 row or 8,000.

0220 runs its Triton kernels for decode steps (up to FUSED_MAX_PAIRS (token, expert) pairs) and
hands larger steps to upstream's grouped_mm, whose CUTLASS GEMMs sum in another order. A token
therefore gets other bits when the step it lands in passes 64 tokens: a short prompt alone takes
0220, beside other requests grouped_mm (W10's invariance probe; W11: with the attention and GEMMs
made batch-invariant by 0370 and 0380, this switch is what is left of batched != alone).

With the knob on, large steps run the same two kernels as decode steps. Only the launch changes:
the pairs are sorted into blocks of BLOCK_M rows (more rows share each read of an expert's
weights) and the tiles are wider and shallower. Each element's sum keeps its order: on an H200 a
Triton dot's bits depend neither on the tile nor on its depth (W11 tile-bits; W12 tune: the
large-step launch gave the first tokens the same bits as the decode launch). Under Triton's CPU
interpreter the depth does change the bits, so there the large steps keep the decode depth.
The top_k rows of a token are then added in a fixed order, k = 0, 1, ..., in float32, by one
program per token and column block (`combine`), for every step size alike; 0220 alone leaves that
sum to torch. The combine skips the rows of pairs routed outside the experts (0220's kernels never
write them), so the experts' output is not zeroed first. `at_load` reads the knob once, so no step
reads it.

PB_MOE_TMA (0430, on top of this knob) has the large steps' kernels read the experts' weights
through TMA descriptors: the same values into the same dots, so the same bits.

PB_MOE_DECODE_ROWS=N (0910, on top of this knob): a step past the decode size whose pairs average
at most N rows an expert keeps 0220's decode launch (16-row blocks) instead of the large one. With
128 experts, 128 decoding streams give 1,024 pairs, about 8 rows an expert: the large launch pads
each expert's block to 128 rows, so the step computes sixteen times its rows and reads every
expert's weights besides; 16-row blocks compute about twice their rows and read an expert's
weights once or twice. Which launch runs changes the tiles, not a row's sums (as above), so the
bits are the same.
"""

import sys

import torch

from .. import knobs
from . import tma
from .common import INTERPRET, kernels

ENABLED = False  # set by at_load
TMA = False  # set by at_load: PB_MOE_TMA (0430) on as well
DECODE_ROWS = 0  # set by at_load: PB_MOE_DECODE_ROWS (0910)
BLOCK_M = 128  # rows of a block of one expert's pairs in large steps (0220's decode blocks hold 16)
# (columns, depth, warps, stages) of the gate/up and down kernels in large steps: the fastest of
# W13's sweep on an H200, with 0220's 16-byte stores (an 8K-token step at TP=1: gate/up 2.95 ms,
# down 1.80 ms a layer; W12's launch took 8.7 ms for both with single-value stores)
GATE_UP_TILES = (128, 64, 8, 3)
DOWN_TILES = (256, 64, 8, 4)
COMBINE_BLOCK = 256


def on() -> bool:
    return bool(knobs.get("PB_MOE_ONE_PATH"))


def large_tiles(decode_depths: tuple[int, int]) -> tuple[tuple, tuple]:
    """The (gate/up, down) launch tiles of a large step; under Triton's CPU interpreter with the
    decode launch's depths, which there decide the bits."""
    if INTERPRET:
        (gu_n, _, *gu_rest), (d_n, _, *d_rest) = GATE_UP_TILES, DOWN_TILES
        return (gu_n, decode_depths[0], *gu_rest), (d_n, decode_depths[1], *d_rest)
    return GATE_UP_TILES, DOWN_TILES


def weight_descriptors(w_gu: torch.Tensor, w_d: torch.Tensor, gate_up_block: tuple, down_block: tuple):
    """0430's TMA descriptors of the experts' weights as 2-D tables, gate/up [E * 2I, H] and down
    [E * H, I], read a [columns, depth] block at a time; None where TMA cannot read them (not
    contiguous, not half precision, an address or row off 16 bytes, or no host descriptors in
    this Triton)."""
    if any(w.dtype not in (torch.bfloat16, torch.float16) or not w.is_contiguous() for w in (w_gu, w_d)):
        return None
    found = (tma.descriptor(w_gu.view(-1, w_gu.shape[-1]), list(gate_up_block)),
             tma.descriptor(w_d.view(-1, w_d.shape[-1]), list(down_block)))
    return None if None in found else found


def combine(y: torch.Tensor, index: torch.Tensor, num_experts: int) -> torch.Tensor:
    """y [tokens * top_k, hidden] (a token's rows together) -> [tokens, hidden], each token's rows
    added in order k = 0 .. top_k - 1 in float32. The rows of pairs that `index` [tokens, top_k]
    routes outside [0, num_experts) are skipped (the experts never wrote them, so y need not be
    zeroed)."""
    (tokens, top_k), hidden = index.shape, y.shape[-1]
    out = torch.empty((tokens, hidden), dtype=y.dtype, device=y.device)
    if tokens:
        kernels("moe_one_path").pb_moe_combine_ordered[(tokens, -(-hidden // COMBINE_BLOCK))](
            y, index.contiguous(), out, hidden, num_experts, y.stride(0), out.stride(0), TOP_K=top_k,
            BLOCK=COMBINE_BLOCK)
    return out


def wide(n_pairs: int, num_experts: int) -> bool:
    """Whether a step of `n_pairs` pairs past the decode size runs the large launch: always, unless
    0910 keeps steps of at most DECODE_ROWS rows an expert on average at the decode launch."""
    return not DECODE_ROWS or n_pairs > DECODE_ROWS * num_experts


def at_load() -> None:
    """The model-load hook: with the knob on, 0220's kernels take steps of every size."""
    global ENABLED, TMA, DECODE_ROWS
    ENABLED = on()
    TMA = ENABLED and bool(knobs.get("PB_MOE_TMA"))
    DECODE_ROWS = int(knobs.get("PB_MOE_DECODE_ROWS") or 0) if ENABLED else 0
    if DECODE_ROWS:
        sys.stderr.write(f"patchbay: PB_MOE_DECODE_ROWS: steps of at most {DECODE_ROWS} rows an expert on average "
                         "keep the decode launch (16-row blocks)\n")
    if ENABLED:
        sys.stderr.write("patchbay: PB_MOE_ONE_PATH: the fused MoE kernels run steps of every size (no "
                         "grouped_mm above the decode size), a token's expert rows added in a fixed order\n")
    if TMA:
        sys.stderr.write("patchbay: PB_MOE_TMA: large steps read the experts' weights through TMA descriptors\n")


def restore() -> None:
    global ENABLED, TMA, DECODE_ROWS
    ENABLED = TMA = False
    DECODE_ROWS = 0

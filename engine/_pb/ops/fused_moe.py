"""PB_FUSED_MOE: a fused mixture-of-experts forward in Triton, read-each-expert-once.

Upstream's experts run one small matmul per expert that was hit (eager), or gather every
token's expert weights (batched_mm), or group tokens per expert (grouped_mm). Here the
(token, expert) pairs of a step are sorted by expert into blocks of BLOCK_M rows, each
block holding one expert's pairs, and two kernels walk those blocks:

    gate_up:  h[pair] = silu(x[token] @ Wg[e]^T) * (x[token] @ Wu[e]^T)
    down:     y[pair] = weight[pair] * (h[pair] @ Wd[e]^T)

so each selected expert's weights are read once per block (once per step when at most
BLOCK_M rows chose it), rows of other experts never touch them, and experts nobody chose
cost nothing. The pair outputs are summed per token in a fixed order (no atomics), so a
token's result does not depend on which other tokens share the step.

The sort into blocks (`align`) is one Triton program for up to ALIGN_MAX_PAIRS pairs, two
launches of a program a chunk of pairs up to ALIGN_CHUNK_PAIRS, torch ops above that; all are
sized by the step's shape alone (no host sync), so the whole forward can sit in a CUDA graph. The
number of blocks is bounded by the shape: at most pairs // BLOCK_M + min(experts, pairs).
Steps of more than FUSED_MAX_PAIRS pairs (prefill), devices Triton cannot drive and expert
layouts the kernels do not compute (biases, transposed or interleaved weights, another
activation) are left to upstream's grouped_mm. Under tensor parallelism each rank runs its
shard of every expert (the widths come from the weights).
Registered as experts implementation "pb_triton".
"""

from typing import NamedTuple

import torch

from . import stable_launch
from .. import knobs
from .common import INTERPRET, dot_precision, fp8_depth, fp8_step_scale, kernels, pow2

NAME = "pb_triton"
BLOCK_M = 16
ALIGN_MAX_PAIRS = 256  # `align` sorts up to this many pairs in one program ...
ALIGN_CHUNK_PAIRS = 4096  # ... up to this many in two launches of a program a chunk (align_launches), then torch ops
ALIGN_CHUNK = 128  # align_launches: the pairs a program counts and places


class Tiles(NamedTuple):
    """One kernel's launch shape: output columns and reduction step per program, warps, stages."""

    bn: int
    bk: int
    warps: int = 4
    stages: int = 3


# Decode steps (up to FUSED_MAX_PAIRS pairs) run the fused kernels with these launch shapes;
# larger steps (prefill) go to upstream's grouped_mm, whose CUTLASS GEMMs suit many rows per
# expert. The in-graph sweep of `python -m patchbay.gpu_moe --graphs` on an H200 (W06) put
# 32 x 128 tiles ahead of grouped_mm at every size it measured, 1 to 64 tokens (85 vs 174 us
# a layer at one token, 934 vs 1395 at 32); an 8K-token prefill through these kernels took
# 0.44 s against grouped_mm's 0.25, and sizes in between are not measured yet.
FUSED_MAX_PAIRS = 512
DECODE_TILES = (Tiles(32, 128, 4, 4), Tiles(32, 128, 4, 4))
TILES_OVERRIDE = None  # (gate_up, down): the tile sweep only, which runs the fused kernels at any size
DECODE_TMA = False  # the tile sweep only: decode launches read the weights through 0430's TMA descriptors too


def on() -> bool:
    return bool(knobs.get("PB_FUSED_MOE"))


def tiles() -> tuple[Tiles, Tiles]:
    return TILES_OVERRIDE if TILES_OVERRIDE is not None else DECODE_TILES


def max_blocks(n_pairs: int, num_experts: int, block_m: int = BLOCK_M) -> int:
    """Blocks that always suffice: every nonempty expert wastes less than one block."""
    return n_pairs // block_m + min(num_experts, n_pairs)


def align(top_k_index: torch.Tensor, num_experts: int, block_m: int = BLOCK_M):
    """Pairs sorted by expert into blocks of `block_m` rows of one expert each.

    Returns (rows, block_expert): rows[b * block_m + i] is a pair index (token * top_k + k)
    or n_pairs for padding; block_expert[b] is the block's expert, or -1 for an unused
    block. Within an expert, pairs keep their order. Pairs routed to an index outside
    [0, num_experts) (masked) are left out."""
    flat = top_k_index.reshape(-1)
    n_pairs = flat.numel()
    if n_pairs > ALIGN_CHUNK_PAIRS:
        return align_torch(top_k_index, num_experts, block_m)
    blocks = max_blocks(n_pairs, num_experts, block_m)
    rows = torch.empty(blocks * block_m, dtype=torch.int32, device=flat.device)
    block_expert = torch.empty(blocks, dtype=torch.int32, device=flat.device)
    if n_pairs > ALIGN_MAX_PAIRS:  # a decode step of many streams (0910's, 0390's small large steps)
        return align_launches(flat.contiguous(), rows, block_expert, num_experts, block_m)
    if stable_launch.STABLE:  # 0450: three sizes of launch (64, 128 or 256 pairs), masked to the step's pairs
        p2 = max(64, pow2(n_pairs))
        b2 = pow2(max_blocks(p2, num_experts, block_m))
    else:
        p2, b2 = pow2(n_pairs), pow2(blocks)
    warps = 4 if p2 <= 64 else 8
    kernels("fused_moe").pb_moe_align[(1,)](flat.contiguous(), rows, block_expert, n_pairs, num_experts, blocks,
                                            P=p2, E=pow2(num_experts), B=b2, BM=block_m, num_warps=warps)
    return rows, block_expert


def align_launches(flat: torch.Tensor, rows: torch.Tensor, block_expert: torch.Tensor, num_experts: int,
                   block_m: int = BLOCK_M):
    """`align` of many pairs in two launches of a program a chunk of ALIGN_CHUNK pairs, the first
    counting each chunk's pairs an expert, the second placing them: the rows and blocks of
    pb_moe_align (on one H100, W76: 13 us a layer at 64 and 128 tokens, against 35 and 65 for
    one program walking the chunks and 97 for torch's sort)."""
    kernel, n_pairs, experts = kernels("fused_moe"), flat.numel(), pow2(num_experts)
    chunks = -(-n_pairs // ALIGN_CHUNK)
    counts = torch.empty((chunks, experts), dtype=torch.int32, device=flat.device)
    kernel.pb_moe_align_count[(chunks,)](flat, counts, rows, n_pairs, num_experts, rows.numel(), C=ALIGN_CHUNK,
                                         E=experts, num_warps=4)
    kernel.pb_moe_align_place[(chunks,)](flat, counts, rows, block_expert, n_pairs, num_experts, block_expert.numel(),
                                         C=ALIGN_CHUNK, E=experts, CH=pow2(chunks), BM=block_m, num_warps=4)
    return rows, block_expert


def align_torch(top_k_index: torch.Tensor, num_experts: int, block_m: int = BLOCK_M):
    """`align` in torch ops, for steps with more pairs than one program holds."""
    flat = top_k_index.reshape(-1).to(torch.int64)
    n_pairs = flat.numel()
    device = flat.device
    keep = (flat >= 0) & (flat < num_experts)
    experts = torch.where(keep, flat, torch.full_like(flat, num_experts))
    # histc, not bincount: bincount asks the host for the largest value (no CUDA graph then);
    # histc takes integers on CUDA and floats on the CPU.
    binned = experts.float() if device.type == "cpu" else experts.int()
    counts = torch.histc(binned, bins=num_experts + 1, min=0, max=num_experts)[:num_experts].to(torch.int64)
    padded = (counts + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(experts, stable=True)
    sorted_experts = experts[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    valid_sorted = sorted_experts < num_experts
    e_safe = torch.where(valid_sorted, sorted_experts, torch.zeros_like(sorted_experts))
    rank = torch.arange(n_pairs, device=device) - first_of_expert[e_safe]
    dest = starts[e_safe] + rank
    blocks = max_blocks(n_pairs, num_experts, block_m)
    rows = torch.full((blocks * block_m,), n_pairs, dtype=torch.int32, device=device)
    dest = torch.where(valid_sorted, dest, torch.full_like(dest, blocks * block_m))  # out of range: dropped
    rows_ext = torch.cat([rows, torch.zeros(1, dtype=torch.int32, device=device)])
    rows_ext.scatter_(0, dest, order.to(torch.int32))
    rows = rows_ext[:-1]
    block_starts = torch.arange(blocks, device=device) * block_m
    block_expert = torch.searchsorted(ends, block_starts, right=True)
    block_expert = torch.where(block_starts < ends[-1], block_expert, torch.full_like(block_expert, -1))
    return rows, block_expert.to(torch.int32)


def _kernels_fit(experts) -> bool:
    """The layout the kernels compute: [gate; up] packed, not transposed, no biases, silu gate,
    no norm after each expert, all experts on this rank (as GLM-4.5's experts are)."""
    from ...integrations.moe import _default_apply_gate

    return (getattr(experts, "is_concatenated", True) and not getattr(experts, "is_transposed", False)
            and not getattr(experts, "has_bias", False) and getattr(experts, "has_gate", True)
            and not getattr(experts, "has_post_expert_norm", False)
            and not getattr(experts, "_is_expert_parallel", False)
            and getattr(type(experts), "_apply_gate", _default_apply_gate) is _default_apply_gate
            and getattr(experts.config, "hidden_act", None) == "silu")


def takes_kernels(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor) -> bool:
    """Whether `experts_forward` runs this step through the kernels (else upstream's grouped_mm)."""
    from . import moe_one_path

    large = hidden_states.shape[0] * top_k_index.shape[-1] > FUSED_MAX_PAIRS and TILES_OVERRIDE is None
    return ((not large or moe_one_path.ENABLED) and (hidden_states.is_cuda or INTERPRET) and _kernels_fit(self))


def experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                    top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts implementation: same contract as upstream's eager forward.

    0810: experts whose `pb_fp8` holds the scales of float8 weights (see _fp8_products) run the
    float8 kernels (callers send such experts here only when fp8_takes says so)."""
    from . import moe_one_path

    tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    large = tokens * top_k > FUSED_MAX_PAIRS and TILES_OVERRIDE is None
    one_path = moe_one_path.ENABLED  # 0390: large steps take these kernels too
    if not takes_kernels(self, hidden_states, top_k_index):
        from ...integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(self, hidden_states, top_k_index, top_k_weights)
    kernel = kernels("fused_moe")
    fp8 = getattr(self, "pb_fp8", None)
    num_experts = self.num_experts
    x = hidden_states.contiguous()
    w_gu, w_d = (w.to_local() if hasattr(w, "to_local") else w for w in (self.gate_up_proj, self.down_proj))
    # [E, 2I, H] and [E, H, I], I read from the weights: under tensor parallelism each rank holds
    # its shard of every expert (half of I at TP=2) while the module keeps the model's width.
    inter = w_d.shape[-1]
    if w_gu.shape[1] != 2 * inter:
        raise ValueError(f"pb_triton experts: gate_up_proj {tuple(w_gu.shape)} does not match down_proj "
                         f"{tuple(w_d.shape)}")
    block_m, (t_gu, t_d) = BLOCK_M, tiles()
    # 0910: a large step of few rows an expert keeps the decode launch
    large = large and one_path and moe_one_path.wide(tokens * top_k, num_experts)
    if large:
        large_gu, large_d = moe_one_path.large_tiles((t_gu.bk, t_d.bk))
        block_m, t_gu, t_d = moe_one_path.BLOCK_M, Tiles(*large_gu), Tiles(*large_d)
    if x.dtype == torch.float32 and not INTERPRET:
        # float32 tiles hold twice the bytes: the large tiles' 3-4 stages would ask for more
        # shared memory than a Hopper has (W54). Fewer loads in flight, the same sums.
        t_gu, t_d = (t._replace(stages=min(t.stages, 2)) for t in (t_gu, t_d))
    descriptors = None
    if (moe_one_path.TMA if large else DECODE_TMA) and fp8 is None:  # 0430: the experts' weights through TMA
        descriptors = moe_one_path.weight_descriptors(w_gu, w_d, (t_gu.bn, t_gu.bk), (t_d.bn, t_d.bk))
    rows, block_expert = align(top_k_index, num_experts, block_m)
    n_pairs = tokens * top_k
    blocks = block_expert.numel()
    h = torch.empty((n_pairs, inter), dtype=x.dtype, device=x.device)
    # 0390's combine skips the rows of masked pairs, so only the plain sum needs them zeroed
    y = (torch.empty if one_path else torch.zeros)((n_pairs, hidden), dtype=x.dtype, device=x.device)
    weights = top_k_weights.reshape(-1).contiguous()
    if fp8 is not None:
        _fp8_products(fp8, x, w_gu, w_d, h, y, rows, block_expert, weights, top_k, block_m)
    else:
        kernel.pb_moe_gate_up[(blocks, -(-inter // t_gu.bn))](
            x, descriptors[0] if descriptors else w_gu, h, rows, block_expert, n_pairs, top_k, hidden, inter,
            x.stride(0), w_gu.stride(0), w_gu.stride(1), h.stride(0), BM=block_m, BN=t_gu.bn, BK=t_gu.bk,
            EVEN_K=hidden % t_gu.bk == 0, W_TMA=descriptors is not None, num_warps=t_gu.warps,
            num_stages=t_gu.stages)
        kernel.pb_moe_down[(blocks, -(-hidden // t_d.bn))](
            h, descriptors[1] if descriptors else w_d, y, rows, block_expert, weights, n_pairs, hidden, inter,
            h.stride(0), w_d.stride(0), w_d.stride(1), y.stride(0), BM=block_m, BN=t_d.bn, BK=t_d.bk,
            EVEN_K=inter % t_d.bk == 0, W_TMA=descriptors is not None, num_warps=t_d.warps, num_stages=t_d.stages)
    if one_path:
        return moe_one_path.combine(y, top_k_index, num_experts)
    return y.view(tokens, top_k, hidden).sum(dim=1)


def fp8_takes(fp8: dict) -> bool:
    """0810: whether the float8 kernels compute these experts (a depth keeps each step in one scale
    column of both weights)."""
    return all(k_offset is not None and fp8_depth(scale_k, k_offset) is not None
               for _, _, k_offset, scale_k in fp8.values())


def _fp8_products(fp8: dict, x, w_gu, w_d, h, y, rows, block_expert, weights, top_k: int, block_m: int) -> None:
    """0810: the gate/up and down kernels on float8 weights, each expanded with its block's scale
    (fp8_tiles.expanded_sum): `fp8` holds, for "gate_up" and "down", the scale grid [E, rows, cols],
    the grid row of each weight row, the model-wide column of the shard's first k, and the columns
    a scale covers. The weight rows a program sums, its warps and stages are the float8 GEMM's for
    as many rows as a block holds (invariant_gemm.fp8_tiles): the tensor core's 64-row side at
    every block size, so a pair's bits do not depend on it."""
    from .invariant_gemm import fp8_tiles

    kernel = kernels("fused_moe")
    n_pairs, (hidden, inter), blocks = h.shape[0], w_d.shape[1:], block_expert.numel()
    t = fp8_tiles(block_m)
    width, warps, stages, precision = t.n, t.warps, t.stages, dot_precision(x)
    grid, grid_rows, k_offset, scale_k = fp8["gate_up"]
    kernel.pb_moe_gate_up_fp8[(blocks, -(-inter // width))](
        x, w_gu, h, rows, block_expert, grid, grid_rows, n_pairs, top_k, hidden, inter, k_offset, x.stride(0),
        w_gu.stride(0), w_gu.stride(1), h.stride(0), *grid.stride(), SCALE_K=scale_k, BM=block_m, BN=width,
        BK=fp8_depth(scale_k, k_offset), PRECISION=precision, STEP_SCALE=fp8_step_scale(x), num_warps=warps,
        num_stages=stages)
    grid, grid_rows, k_offset, scale_k = fp8["down"]
    kernel.pb_moe_down_fp8[(blocks, -(-hidden // width))](
        h, w_d, y, rows, block_expert, weights, grid, grid_rows, n_pairs, hidden, inter, k_offset, h.stride(0),
        w_d.stride(0), w_d.stride(1), y.stride(0), *grid.stride(), SCALE_K=scale_k, BM=block_m, BN=width,
        BK=fp8_depth(scale_k, k_offset), PRECISION=precision, STEP_SCALE=fp8_step_scale(h), num_warps=warps,
        num_stages=stages)


def register() -> None:
    from ...integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(NAME, experts_forward)


def model_kwargs(kwargs: dict) -> dict:
    """The model-load hook: with the knob on, load with this experts implementation."""
    if on():
        register()
        kwargs = {**kwargs, "experts_implementation": NAME}
    return kwargs

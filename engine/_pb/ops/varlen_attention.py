"""PB_VARLEN_ATTENTION: the batching loop's attention as one Triton kernel over each sequence's
own keys, instead of sdpa over one block-diagonal mask of the whole step.

With sdpa, upstream's paged attention gathers every key the step reads into one tensor, repeats
the 8 KV heads to the 96 query heads, and attends over a mask of [step tokens, every key of the
step]. A step's cost and memory therefore grow with the product of its queries and all of its
keys, not with each sequence's own. On an H200 (W10, memory-*):
- with a KV pool of 32 x 8K tokens full, one H200 ran out of memory repeating the keys (4.69 GiB);
- 32 cold 8K prompts sent together got their first tokens at 3.3 ... 53.6 s at TP=2, where one
  prompt alone takes 0.11 s.
The result also depends on the batch: a row among others gets other bits than alone
(W10, invariance-probe), because sdpa picks its kernel and its split of the work by the whole
problem, and decode steps of one row take another path (the KV heads packed).

Here one program handles one block of one sequence's query rows for one head, and walks that
sequence's keys (its cached ones first, then the step's) in fixed blocks from its first key,
with the running softmax of flash attention in float32. A sequence with one query token (a
decode row) goes to a second kernel instead: one program per KV head takes the query heads that
share it as the rows of its dots, so each key is read once. The keys are read per KV head (no
repeat) and no mask exists. A row's arithmetic depends only on its own sequence's keys and the
kernel's fixed block sizes, not on the other sequences in the step, nor on the step's padding.
Padded query rows get zeros. Under CUDA graphs the grid is sized by the padded step; programs
past the step's last block return at once.

It changes output (another kernel, another order of sums). It is checked under Triton's CPU
interpreter against upstream's masked sdpa (tests/test_varlen_attention.py) and on the GPU by
tests/test_kernels_gpu.py. On an H200 (W11) it served 32 cold 8K prompts at once where sdpa ran
out of memory, and doubled the C32 decode rate of distinct prompts; a lone 8K prompt's attention
takes longer than cuDNN's causal kernel (W12 has the launch sweep). Steps it does not fit (a
sliding window, a head size that is not a power of two, a block table, a position bias) keep
upstream's path. `at_load` reads the knob once, so no step reads it.

PB_VARLEN_FAST (0400, on top of this knob) changes only the prompt blocks' kernel: keys and values
come through TMA descriptors, and the running softmax scales the raw scores inside the exponent's
FMA. On an H200 one 8K prompt's layer took 3.15 ms against 4.02 (W13 launch-sweep-5); where TMA
cannot read the step's keys (an address or stride off 16 bytes) the blocks take the pointer path.

PB_SPLIT_DECODE (0740) changes only the decode rows: a row's keys are attended in parts of about
PART_BLOCKS blocks (at most MAX_PARTS), a count that follows from the row's own key count, by a
fixed grid of programs that take the step's parts in turn; a second kernel merges a row's parts.
At one stream 0370's decode kernel runs 8 programs (one a KV head) over the whole context: after a
32K-token prompt production decoded at 0.28 of the roofline (W34), with 0740 and 0750 at 0.63 (W39).

PB_CACHE_READ (0750) lets the kernels read the cache's own pages through the step's read index
(`forward_from_cache`, in place of the cache's update), instead of upstream's gather of every key
the step reads into a new tensor; same bits, a gather less a layer and step.

PB_KV_FP8 (0830) with 0750: the cache's rows are e4m3 (int8 with 0840's PB_KV_INT8) with a
power-of-two scale a token and KV head (kv_fp8.py). The decode kernels read them, widen the
elements to float16 and apply a key's scale to its scores and a value's to its weights (KV_FP8):
within a rounding of the bfloat16 kernels over the dequantized cache, not their bits. The prompt blocks read the keys of their
sequences dequantized by a gather first (kv_fp8.gather_prompts), which gives those bits; converting
every element of their 128 x 128 blocks in the kernel made them 1.6-2.3 times slower on an H100.

PB_FEWER_LAUNCHES (0950) drops small launches a layer: the prompt kernel counts the step's query
blocks from cu_q itself (COUNT), where the host ran about nine torch launches a layer for them
(lengths, blocks, their running sum, casts), and 0750's write of the step's keys and values is one
launch (pb_kv_write) instead of two index_copy_ calls. The same blocks and bytes: the same bits.

PB_ATTN_GRID (0940) sizes two launches to the step: the prompt kernel's programs, one a head for
each BLOCK_M of the tokens plus GRID_EXTRA, take the step's query blocks in turn instead of one a
block the step might hold (at a step of decode rows alone every such program found nothing), and
where a program a decode row and KV head fills the GPU (rows x KV heads at least its SMs), 0740's
merge runs one such program, merging the query heads in turn, in place of one a query head (with
fewer rows the merges run side by side as before). The same blocks and merges by the same code:
the same bits.
"""

import functools
import sys

import torch

from .. import knobs
from . import kv_fp8, stable_launch, tma
from .common import INTERPRET, TRITON, kernels, pow2

ENABLED = False  # set by at_load: the knob on, and Triton installed, when the model was loaded
FAST = False  # set by at_load: PB_VARLEN_FAST (0400) on as well
SEQ_CHUNK = 64  # with stable_launch.STABLE (0450): the sequences the prompt kernel counts at a time, whatever the step holds
BLOCK_M, BLOCK_N = 128, 128  # query rows (prompt blocks) and keys a program takes at a time
WARPS = 8  # a prompt block's program (a decode row's takes 4)
SPLIT = False  # set by at_load: PB_SPLIT_DECODE (0740) on as well
READ_CACHE = False  # set by at_load: PB_CACHE_READ (0750) on as well
PART_BLOCKS, MAX_PARTS = 4, 64  # 0740: key blocks a decode row's part takes (about); parts a row at most (a power of 2)
PROGRAMS_PER_SM = 8  # 0740: the decode parts' programs, over the KV heads (any count gives the same bits)
GRID = False  # set by at_load: PB_ATTN_GRID (0940) on as well
GRID_EXTRA = 4  # 0940: the prompt kernel's programs a head past one a BLOCK_M of the step's query tokens
FEWER = False  # set by at_load: PB_FEWER_LAUNCHES (0950) on as well


def on() -> bool:
    return bool(knobs.get("PB_VARLEN_ATTENTION"))


def heads_fit(dim: int, heads: int, kv_heads: int) -> bool:
    """The head shapes the kernels take: a power-of-two head size of 16 or more, and whole groups
    of query heads over each KV head (0850 asks the same of a model's config)."""
    return dim >= 16 and dim & (dim - 1) == 0 and kv_heads > 0 and heads % kv_heads == 0


def fits(module, query: torch.Tensor, key: torch.Tensor, kwargs: dict) -> bool:
    """A paged step of plain [1, heads, tokens, dim] tensors this kernel covers (no sliding window)."""
    dim = query.shape[-1]
    heads, kv_heads = query.shape[1], key.shape[1]
    return (type(query) is torch.Tensor and (query.is_cuda or INTERPRET) and query.dim() == 4
            and query.shape[0] == 1 and heads_fit(dim, heads, kv_heads)
            and query.stride(-1) == 1 and key.stride(-1) == 1 and "cu_seq_lens_q" in kwargs
            and torch.is_tensor(kwargs.get("cu_seq_lens_k")) and kwargs.get("block_table") is None
            and getattr(module, "sliding_window", None) is None
            and getattr(getattr(module, "config", None), "sliding_window", None) is None)


def _descriptors(key: torch.Tensor, value: torch.Tensor):
    """0400's TMA descriptors of the step's keys and values as [tokens, KV heads, dim] views, one
    block of BLOCK_N tokens of one head at a time; None where TMA cannot read them (a stride or
    address off 16 bytes, or no descriptor support in this Triton)."""
    views = [t[0].transpose(0, 1) for t in (key, value)]
    found = [tma.descriptor(t, [BLOCK_N, 1, t.shape[-1]]) for t in views]
    return None if None in found else found


def forward(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling, kwargs: dict):
    """The step's attention output [1, tokens, heads, dim] (sdpa's layout after its transpose),
    or None where upstream's path applies."""
    if not ENABLED or not fits(module, query, key, kwargs):
        return None
    return _attend(query, key, value, scaling, kwargs["cu_seq_lens_q"], kwargs["cu_seq_lens_k"])


def forward_from_cache(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling, cache,
                       kwargs: dict):
    """PB_CACHE_READ (0750), called in place of the paged cache's update: the step's new keys and
    values written to the cache as upstream writes them, then the step's attention read straight
    from the cache's pages through the step's read index, without upstream's gather of every key
    the step reads into one tensor. None where upstream's update and path apply: another kind of
    cache group (a sliding window), a block table, a step that reads no cached keys (upstream
    gathers nothing then) unless the cache is e4m3 (0830: such a step reads its own rows back, so
    every attention reads the same e4m3 rows), or a step the kernel does not fit."""
    if not (ENABLED and READ_CACHE) or kwargs.get("block_table") is not None:
        return None
    allocator = cache.layer_to_allocator[module.layer_idx]
    views = getattr(allocator, "_kv_token_views", None)
    if views is None or module.layer_idx not in views:
        return None
    read_index = kwargs["read_index"][allocator.index]
    cu_k = kwargs["cu_seq_lens_k"][allocator.layer_type].to(torch.int32)
    scales = getattr(allocator, "_pb_kv_scales", None)
    if (read_index.numel() == 0 and scales is None) or not fits(module, query, key, {**kwargs, "cu_seq_lens_k": cu_k}):
        return None
    k_cache, v_cache = views[module.layer_idx]  # [cache rows, KV heads, dim]
    write_index = kwargs["write_index"][allocator.index]
    if scales is not None:  # PB_KV_FP8 (0830): 8-bit rows and their scales, read by the kernels
        scales = scales[module.layer_idx]
        kv_fp8.write_both((k_cache, v_cache), scales, write_index, key[0].transpose(0, 1), value[0].transpose(0, 1))
        k_cache, v_cache = k_cache.view(kv_fp8.element()), v_cache.view(kv_fp8.element())
        if read_index.numel() == 0:  # a step of fresh prompts: each reads the rows it has just written
            read_index = write_index
    elif FEWER:  # 0950: both in one launch
        _write_both(k_cache, v_cache, write_index, key[0].transpose(0, 1), value[0].transpose(0, 1))
    else:
        k_cache.index_copy_(0, write_index, key[0].transpose(0, 1))
        v_cache.index_copy_(0, write_index, value[0].transpose(0, 1))
    # TMA reads a key block as one run of rows: it must not cross a page
    whole_blocks = getattr(allocator, "tokens_per_page", 1) % BLOCK_N == 0
    return _attend(query, k_cache.transpose(0, 1).unsqueeze(0), v_cache.transpose(0, 1).unsqueeze(0), scaling,
                   kwargs["cu_seq_lens_q"], cu_k, read_index, fast=FAST and whole_blocks, scales=scales)


def _write_both(k_cache: torch.Tensor, v_cache: torch.Tensor, index: torch.Tensor, keys: torch.Tensor,
                values: torch.Tensor) -> None:
    """0950 with 0750: a step's new keys and values [tokens, KV heads, dim] into their cache rows
    `index` ([rows, KV heads, dim] each), in one launch (pb_kv_write) where the kernels run, the
    bytes upstream's two index_copy_ calls write; those calls elsewhere."""
    if (not (keys.is_cuda or INTERPRET) or keys.shape[0] == 0 or keys.dtype != k_cache.dtype
            or values.dtype != v_cache.dtype or k_cache.stride() != v_cache.stride() or k_cache.stride(2) != 1
            or keys.stride(2) != 1 or values.stride(2) != 1 or keys.shape[1:] != k_cache.shape[1:]):
        k_cache.index_copy_(0, index, keys)
        v_cache.index_copy_(0, index, values)
        return
    kernels("varlen_attention").pb_kv_write[(keys.shape[0],)](
        keys, values, k_cache, v_cache, index, keys.stride(0), keys.stride(1), values.stride(0), values.stride(1),
        k_cache.stride(0), k_cache.stride(1), KV_HEADS=keys.shape[1], HEAD_DIM=keys.shape[2],
        BLOCK_H=pow2(keys.shape[1]), num_warps=4)


def _attend(query, key, value, scaling, cu_q, cu_k, index=None, fast=None, scales=None):
    """The kernels over the step's keys ([1, KV heads, keys, dim]), or with `index` (0750) over the
    cache's rows, sequence s's j-th key at row index[cu_k[s] + j]. `scales` (0830): the keys and
    values are e4m3 and these are their float32 scales ([rows, KV heads] each, one row stride)."""
    kernel = kernels("varlen_attention")
    fast = FAST if fast is None else fast
    sequences = cu_q.numel() - 1
    _, heads, tokens, dim = query.shape
    groups = heads // key.shape[1]
    out = torch.zeros((1, tokens, heads, dim), dtype=query.dtype, device=query.device)
    if sequences < 1 or tokens == 0:
        return out
    scale = float(scaling if scaling is not None else dim ** -0.5)
    strides = (query.stride(2), query.stride(1), key.stride(2), key.stride(1), value.stride(2), value.stride(1),
               out.stride(1), out.stride(2))
    if FEWER:  # 0950: the prompt kernel counts the blocks from cu_q itself
        block_end = cu_q  # unread
    else:  # sequences of more than one query token: blocks of BLOCK_M rows, counted over the step in order
        lengths = cu_q[1:] - cu_q[:-1]
        blocks = torch.where(lengths > 1, (lengths + BLOCK_M - 1) // BLOCK_M, 0)
        block_end = torch.cumsum(blocks, 0).to(torch.int32)
    indexed = index is not None
    index = index if indexed else cu_k  # unread without INDEXED
    fp8 = scales is not None
    scaled = (*scales, scales[0].stride(0)) if fp8 else (key, value, 0)  # unread without KV_FP8
    prompt_kv, prompt_index, prompt_strides = (key, value), index, strides
    if fp8:  # 0830: the prompt rows' keys dequantized first (the gather's layout), the decode rows' read as e4m3
        prompt_kv = kv_fp8.gather_prompts(key[0].transpose(0, 1), value[0].transpose(0, 1), scales, index, cu_q, cu_k,
                                          query.dtype, BLOCK_N)
        prompt_index = cu_k
        prompt_strides = strides[:2] + tuple(t.stride(d) for t in prompt_kv for d in (2, 1)) + strides[6:]
    descriptors = _descriptors(*prompt_kv) if fast else None
    kernel.pb_varlen_attention[(heads, prompt_programs(tokens, sequences))](
        query, *prompt_kv, out, *(descriptors or prompt_kv), prompt_index, cu_q, cu_k, block_end, sequences, scale,
        *prompt_strides, GROUPS=groups, HEAD_DIM=dim, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        SEQ_P2=SEQ_CHUNK if stable_launch.STABLE else max(16, pow2(sequences)), FAST=descriptors is not None,
        INDEXED=indexed and not fp8, TURNS=GRID, COUNT=FEWER, num_warps=WARPS)
    # sequences of one query token (decode): one program a KV head reads its keys once for its query heads
    if SPLIT:
        keys = index.numel() if indexed else key.shape[2]
        _decode_in_parts(kernel, query, key, value, out, index, indexed, keys, cu_q, cu_k, sequences, scale, strides,
                         groups, scaled, fp8)
    else:
        kernel.pb_varlen_attention_decode[(sequences, key.shape[1])](
            query, key, value, out, *scaled, index, cu_q, cu_k, scale, *strides, GROUPS=groups, HEAD_DIM=dim,
            BLOCK_H=max(16, pow2(groups)), BLOCK_N=BLOCK_N, INDEXED=indexed, KV_FP8=fp8, num_warps=4)
    return out


def prompt_programs(tokens: int, sequences: int) -> int:
    """The prompt kernel's programs a head. A step's query blocks number at most one a BLOCK_M of
    its tokens plus one a sequence (each sequence's last block may be partial), so 0370 launches
    that many, and at a step of decode rows alone (none) every one of them starts, finds no block
    and ends: at 128 streams 96 x 129 programs a layer, each holding an SM's worth of shared memory
    while it looks. With PB_ATTN_GRID (0940) the grid is one a BLOCK_M of the tokens plus
    GRID_EXTRA, and its programs take the step's blocks in turn (the kernel's TURNS): a block's
    rows get the same bits whichever program computes them. On an H100 a decode step was no
    faster for it (W75): the empty programs end quickly."""
    if GRID:
        return -(-tokens // BLOCK_M) + min(sequences, GRID_EXTRA)
    return -(-tokens // BLOCK_M) + sequences


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _programs(device: torch.device, kv_heads: int) -> int:
    """0740: the programs a KV head gets for the decode parts: PROGRAMS_PER_SM an SM over the KV
    heads (a handful under the interpreter). Any count gives the same bits."""
    if device.type != "cuda":
        return 3
    return max(1, PROGRAMS_PER_SM * _sm_count(device) // kv_heads)


def _decode_in_parts(kernel, query, key, value, out, index, indexed: bool, keys: int, cu_q, cu_k, sequences: int,
                     scale: float, strides, groups: int, scaled, fp8: bool):
    """PB_SPLIT_DECODE (0740): the decode rows' keys split into parts by each row's own key count,
    the parts spread over the GPU, then merged in key order (see the module's text)."""
    kv_heads, dim = key.shape[1], query.shape[-1]
    block_h = max(16, pow2(groups))
    # a row of b key blocks has at most ceil(b / PART_BLOCKS) parts and at most MAX_PARTS: over the step,
    # this many at most (the second bound keeps a step padded to a wide KV read, 0930, from growing them)
    slots = min(2 * sequences + keys // (BLOCK_N * PART_BLOCKS) + 1, sequences * MAX_PARTS) * kv_heads
    acc = torch.empty((slots, block_h, dim), dtype=torch.float32, device=query.device)
    ml = torch.empty((slots, 2, block_h), dtype=torch.float32, device=query.device)
    sizes = dict(GROUPS=groups, HEAD_DIM=dim, BLOCK_H=block_h, BLOCK_N=BLOCK_N, PART_BLOCKS=PART_BLOCKS,
                 MAX_PARTS=MAX_PARTS, SEQ_CHUNK=SEQ_CHUNK)
    programs = _programs(query.device, kv_heads)
    kernel.pb_varlen_attention_decode_parts[(kv_heads, programs)](
        query, key, value, acc, ml, *scaled, index, cu_q, cu_k, sequences, scale, *strides[:6], PROGRAMS=programs,
        INDEXED=indexed, KV_FP8=fp8, **sizes, num_warps=4)
    # 0940: where a program a row and KV head fills the GPU, it merges its query heads in turn
    together = GRID and (query.device.type != "cuda" or sequences * kv_heads >= _sm_count(query.device))
    kernel.pb_varlen_attention_decode_combine[(sequences, kv_heads if together else kv_heads * groups)](
        out, acc, ml, cu_q, cu_k, sequences, *strides[6:], **sizes, ALL_GROUPS=together, num_warps=4)


def at_load() -> None:
    """The model-load hook: with the knob on, paged sdpa steps attend through the kernel."""
    global ENABLED, FAST, SPLIT, READ_CACHE, GRID, FEWER
    knob = on()
    ENABLED = knob and TRITON
    FAST = ENABLED and bool(knobs.get("PB_VARLEN_FAST"))
    SPLIT = ENABLED and bool(knobs.get("PB_SPLIT_DECODE"))
    READ_CACHE = ENABLED and bool(knobs.get("PB_CACHE_READ"))
    GRID = ENABLED and bool(knobs.get("PB_ATTN_GRID"))
    FEWER = ENABLED and bool(knobs.get("PB_FEWER_LAUNCHES"))
    if knob:
        sys.stderr.write("patchbay: PB_VARLEN_ATTENTION: paged attention steps run one Triton kernel per "
                         "sequence's own keys\n")
    if FAST:
        sys.stderr.write("patchbay: PB_VARLEN_FAST: prompt blocks read keys and values through TMA and scale "
                         "scores inside the exponent's FMA\n")
    if SPLIT:
        sys.stderr.write("patchbay: PB_SPLIT_DECODE: a decode row's keys are attended in parts spread over the "
                         "GPU, merged in key order\n")
    if READ_CACHE:
        sys.stderr.write("patchbay: PB_CACHE_READ: attention reads cached keys and values from their pages, "
                         "without gathering them first\n")
    if GRID:
        sys.stderr.write("patchbay: PB_ATTN_GRID: the prompt kernel's grid follows the step's tokens, its programs "
                         "taking the blocks in turn; a decode row's parts are merged a KV head at a time\n")


def restore() -> None:
    """Upstream's attention again (for in-process A/Bs and tests)."""
    global ENABLED, FAST, SPLIT, READ_CACHE, GRID, FEWER
    ENABLED = FAST = SPLIT = READ_CACHE = GRID = FEWER = False

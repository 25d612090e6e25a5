"""PB_SORT_FREE's Triton kernels (see runtime/sort_free.py): a row's token under top-p and min-p
without sorting its vocabulary, in three launches (parts of each row in parallel, then the
row's verdict and, rarely, its further rounds)."""

import triton
import triton.language as tl


@triton.jit
def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * 0x85EBCA6B
    h = h ^ (h >> 13)
    h = h * 0xC2B2AE35
    return h ^ (h >> 16)


@triton.jit
def _noisy(x, key, ids):
    """x - log(E) for each token: E ~ Exp(1) from the row's key and the token id (the batched
    sampler's hash), so the largest is the race's winner; -inf where x is."""
    h = _fmix32(key ^ (ids.to(tl.uint32) * 0x27D4EB2F))
    u = ((h >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    return tl.where(x == float("-inf"), float("-inf"), x - tl.log(-tl.log(u)))


@triton.jit
def _first_best(best, at, vocab):
    """The id of the lanes' best value (`at` holds each lane's id); a tie goes to the smaller id."""
    return tl.min(tl.where(best == tl.max(best, 0), at, vocab), 0)


@triton.jit
def _winner(base, vocab, key, bound_x, bound_i, BLOCK: tl.constexpr):
    """The race's winner among the tokens ranked before (bound_x, bound_i): a larger x, or the
    same x and a smaller id. Each lane keeps its own best over the row, the lanes are compared
    once at the end; a tie goes to the smaller id."""
    offs = tl.arange(0, BLOCK)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    at = offs
    for start in range(0, vocab, BLOCK):
        ids = start + offs
        valid = ids < vocab
        x = tl.load(base + ids, mask=valid, other=float("-inf"))
        allowed = valid & ((x > bound_x) | ((x == bound_x) & (ids < bound_i)))
        g = tl.where(allowed, _noisy(x, key, ids), float("-inf"))
        take = g > best
        best = tl.where(take, g, best)
        at = tl.where(take, ids, at)
    return _first_best(best, at, vocab)


@triton.jit
def _mass_before(base, lo, hi, xw, w, shift, BLOCK: tl.constexpr):
    """The sum of exp(x - shift) over the tokens of [lo, hi) ranked before token w (whose x is xw)."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(lo, hi, BLOCK):
        ids = start + offs
        x = tl.load(base + ids, mask=ids < hi, other=float("-inf"))
        before = (ids < hi) & ((x > xw) | ((x == xw) & (ids < w)))
        acc += tl.where(before, tl.exp(x - shift), 0.0)
    return tl.sum(acc, 0)


@triton.jit
def _kept(mass, z, xw, shift, top_p, min_p):
    """Whether the cuts keep the winner: nothing ranked before it, or less than top_p of the mass
    and at least min_p of the first's weight."""
    return (mass == 0.0) | (((top_p >= 1.0) | (mass < top_p * z)) & (tl.exp(xw - shift) >= min_p))


@triton.jit
def pb_sort_free_parts(x_ptr, key_ptr, part_ptr, vocab, stride, chunk, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """First of three launches, one program per (row, part of the row): the part's largest x, its
    sum of exp(x - largest), and its race winner (noisy value and id), into part_ptr [5, rows, SPLIT]."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    rows = tl.num_programs(0)
    base = x_ptr + row.to(tl.int64) * stride
    key = tl.load(key_ptr + row).to(tl.uint32)
    offs = tl.arange(0, BLOCK)
    lo = part * chunk
    hi = tl.minimum(lo + chunk, vocab)
    high = tl.full((BLOCK,), float("-inf"), tl.float32)
    best = tl.full((BLOCK,), float("-inf"), tl.float32)
    at = lo + offs
    for start in range(lo, hi, BLOCK):
        ids = start + offs
        x = tl.load(base + ids, mask=ids < hi, other=float("-inf"))
        high = tl.maximum(high, x)
        g = tl.where(ids < hi, _noisy(x, key, ids), float("-inf"))
        take = g > best
        best = tl.where(take, g, best)
        at = tl.where(take, ids, at)
    m = tl.max(high, 0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    acc = tl.zeros((BLOCK,), tl.float32)
    for start in range(lo, hi, BLOCK):
        ids = start + offs
        acc += tl.exp(tl.load(base + ids, mask=ids < hi, other=float("-inf")) - shift)
    slot = part_ptr + row * SPLIT + part
    plane = rows * SPLIT
    tl.store(slot, m)
    tl.store(slot + plane, tl.sum(acc, 0))
    tl.store(slot + 2 * plane, tl.max(best, 0))
    tl.store(slot + 3 * plane, _first_best(best, at, vocab).to(tl.float32))


@triton.jit
def _whole(part_ptr, row, rows, vocab, SPLIT: tl.constexpr):
    """The row's largest x, its sum of exp(x - largest) and its race winner, from its parts (the
    same arithmetic in every program that asks)."""
    plane = rows * SPLIT
    slots = part_ptr + row * SPLIT + tl.arange(0, SPLIT)
    highs = tl.load(slots)
    m = tl.max(highs, 0)
    shift = tl.where(m == float("-inf"), 0.0, m)
    z = tl.sum(tl.load(slots + plane) * tl.exp(highs - shift), 0)
    w = _first_best(tl.load(slots + 2 * plane), tl.load(slots + 3 * plane).to(tl.int32), vocab)
    return m, shift, z, w


@triton.jit
def pb_sort_free_mass(x_ptr, part_ptr, vocab, stride, chunk, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    """Second launch, per (row, part): the part's mass ranked before the row's winner, into plane 4."""
    row = tl.program_id(0)
    part = tl.program_id(1)
    rows = tl.num_programs(0)
    base = x_ptr + row.to(tl.int64) * stride
    m, shift, z, w = _whole(part_ptr, row, rows, vocab, SPLIT)
    lo = part * chunk
    mass = _mass_before(base, lo, tl.minimum(lo + chunk, vocab), tl.load(base + w), w, shift, BLOCK)
    tl.store(part_ptr + 4 * rows * SPLIT + row * SPLIT + part, mass)


@triton.jit
def pb_sort_free(x_ptr, top_p_ptr, min_p_ptr, key_ptr, part_ptr, out_ptr, vocab, stride, SPLIT: tl.constexpr,
                 BLOCK: tl.constexpr, MAX_ROUNDS: tl.constexpr):
    """Last launch, one program per row: keep the winner if the cuts do, else race again over the
    tokens ranked before it (the whole row in this one program: a rare round) until they do."""
    row = tl.program_id(0)
    rows = tl.num_programs(0)
    base = x_ptr + row.to(tl.int64) * stride
    top_p = tl.load(top_p_ptr + row)
    min_p = tl.load(min_p_ptr + row)
    key = tl.load(key_ptr + row).to(tl.uint32)
    m, shift, z, w = _whole(part_ptr, row, rows, vocab, SPLIT)
    xw = tl.load(base + w)
    mass = tl.sum(tl.load(part_ptr + 4 * rows * SPLIT + row * SPLIT + tl.arange(0, SPLIT)), 0)
    # The cuts keep a prefix of the ranking, so the first winner inside it is the kept set's. A row
    # of -inf or NaN ends at once, and no row runs more than MAX_ROUNDS (each round leaves about
    # half the ranking before its winner: some 20 rounds for top_p 1e-6 over a flat row).
    keep = (m == float("-inf")) | (z != z) | _kept(mass, z, xw, shift, top_p, min_p)
    rounds = tl.full((), 1, tl.int32)
    while (keep == 0) & (rounds < MAX_ROUNDS):
        w = _winner(base, vocab, key, xw, w, BLOCK)
        xw = tl.load(base + w)
        keep = _kept(_mass_before(base, 0, vocab, xw, w, shift, BLOCK), z, xw, shift, top_p, min_p)
        rounds += 1
    tl.store(out_ptr + row, w.to(tl.int64))

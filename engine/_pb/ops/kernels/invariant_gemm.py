"""PB_INVARIANT_GEMM's Triton kernels (see invariant_gemm.py), in a module of their own so that
nothing imports Triton unless the knob is on.

Every output element is the same sum in both ways of running it: its K range cut into chunks of
CHUNK_K (a multiple of BLOCK_K), each chunk summed from zero in BLOCK_K steps, and the chunks'
sums added to zero in order. `pb_gemm_chunks` writes each chunk's sum as a program of its own
(many programs for few rows) and `pb_gemm_sum` adds them up; `pb_gemm` runs the chunks one after
another in one program (enough programs already)."""

import triton
import triton.language as tl

from . import fp8_tiles


@triton.jit
def chunk_sum(a_ptr, b_ptr, rows, cols, row_ok, col_ok, k_start, k_stop, stride_am, stride_ak, stride_bk,
              stride_bn, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              PRECISION: tl.constexpr):
    """One chunk's float32 sum for a [BLOCK_M, BLOCK_N] tile: A[rows, k_start:k_stop] @ B[k_start:k_stop, cols]."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_stop, BLOCK_K):
        ks = (k + tl.arange(0, BLOCK_K)).to(tl.int64)
        k_ok = ks < k_stop
        a = tl.load(a_ptr + rows[:, None] * stride_am + ks[None, :] * stride_ak, mask=row_ok[:, None] & k_ok[None, :],
                    other=0.0)
        b = tl.load(b_ptr + ks[:, None] * stride_bk + cols[None, :] * stride_bn, mask=k_ok[:, None] & col_ok[None, :],
                    other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def finish(total, bias_ptr, out_ptr, rows, cols, row_ok, col_ok, stride_om, stride_on, HAS_BIAS: tl.constexpr):
    """Add the bias (in float32) and store in the output's type."""
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on,
             total.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def finish_transposed(total, bias_ptr, out_ptr, rows, cols, col_ok, mask, stride_om, stride_on,
                      HAS_BIAS: tl.constexpr):
    """`finish` for a transposed tile (total [columns, rows], as 0810's float8 products sum it)."""
    if HAS_BIAS:
        total += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + rows[None, :] * stride_om + cols[:, None] * stride_on, total.to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit(do_not_specialize=["M"])
def pb_gemm(a_ptr, b_ptr, bias_ptr, out_ptr, M, N, K, CHUNK_K, stride_am, stride_ak, stride_bk, stride_bn,
            stride_om, stride_on, HAS_BIAS: tl.constexpr, CHUNKED: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    """One program an output tile, its chunks summed one after another (tiles ordered in groups of
    GROUP_M row tiles, so neighbouring programs share B's columns in cache). CHUNKED: the weight's
    K is cut into more than one chunk."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % in_group) % group_rows
    tile_n = (pid % in_group) // group_rows
    rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok, col_ok = rows < M, cols < N
    if CHUNKED:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k_start in range(0, K, CHUNK_K):
            k_stop = tl.minimum(k_start + CHUNK_K, K)
            total += chunk_sum(a_ptr, b_ptr, rows, cols, row_ok, col_ok, k_start, k_stop, stride_am, stride_ak,
                               stride_bk, stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
    else:  # one chunk: its sum is the total (one accumulator, so wide tiles keep their registers)
        total = chunk_sum(a_ptr, b_ptr, rows, cols, row_ok, col_ok, 0, K, stride_am, stride_ak, stride_bk,
                          stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
    finish(total, bias_ptr, out_ptr, rows, cols, row_ok, col_ok, stride_om, stride_on, HAS_BIAS)


@triton.jit
def parts_total(part_ptr, offsets, mask, chunks, chunk_elems):
    """The chunks' float32 sums at `offsets` of each chunk's [M, N] part, added to zero in chunk
    order (as pb_gemm adds them). Read past the SM's cache (".cg"): in a LAST_SUM program the
    other programs' parts were written since this kernel began."""
    total = tl.zeros(offsets.shape, dtype=tl.float32)
    for chunk in range(0, chunks):
        total += tl.load(part_ptr + chunk * chunk_elems + offsets, mask=mask, other=0.0, cache_modifier=".cg")
    return total


@triton.jit
def last_of_tile(counter_ptr, tile, chunks):
    """PB_FEWER_LAUNCHES (0950): count this program's part of output tile `tile` as stored, once
    every thread of the program has stored its share, and tell whether it was the tile's last
    part. The count is an acquire-release atomic: the last program sees every part the others
    stored. The last sets the count back to zero for the next launch (launches on one stream do
    not overlap)."""
    tl.debug_barrier()
    seen = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
    last = seen == chunks - 1
    if last:
        tl.store(counter_ptr + tile, 0)
    return last


@triton.jit(do_not_specialize=["M"])
def pb_gemm_chunks(a_ptr, b_ptr, part_ptr, counter_ptr, bias_ptr, out_ptr, M, N, K, CHUNK_K, stride_am, stride_ak,
                   stride_bk, stride_bn, stride_om, stride_on, HAS_BIAS: tl.constexpr, LAST_SUM: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """One program a (row tile, column tile, chunk): that chunk's float32 sum into part[chunk].
    LAST_SUM (0950): the tile's last program to finish adds the parts as pb_gemm_sum does and
    stores the output, so no second launch runs."""
    tile_m, tile_n, chunk = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok, col_ok = rows < M, cols < N
    k_start = chunk * CHUNK_K
    k_stop = tl.minimum(k_start + CHUNK_K, K)
    acc = chunk_sum(a_ptr, b_ptr, rows, cols, row_ok, col_ok, k_start, k_stop, stride_am, stride_ak, stride_bk,
                    stride_bn, BLOCK_M, BLOCK_N, BLOCK_K, PRECISION)
    offsets, mask = rows[:, None] * N + cols[None, :], row_ok[:, None] & col_ok[None, :]
    tl.store(part_ptr + chunk * M * N + offsets, acc, mask=mask)
    if LAST_SUM:
        if last_of_tile(counter_ptr, tile_m * tl.num_programs(1) + tile_n, tl.num_programs(2)):
            total = parts_total(part_ptr, offsets, mask, tl.num_programs(2), M * N)
            finish(total, bias_ptr, out_ptr, rows, cols, row_ok, col_ok, stride_om, stride_on, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def pb_gemm_sum(part_ptr, bias_ptr, out_ptr, M, N, chunks, stride_om, stride_on, HAS_BIAS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The chunks' sums added to zero in chunk order, as pb_gemm adds them."""
    tile_m, tile_n = tl.program_id(0), tl.program_id(1)
    rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    row_ok, col_ok = rows < M, cols < N
    total = parts_total(part_ptr, rows[:, None] * N + cols[None, :], row_ok[:, None] & col_ok[None, :], chunks, M * N)
    finish(total, bias_ptr, out_ptr, rows, cols, row_ok, col_ok, stride_om, stride_on, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def pb_gemm_tma(a_desc, w_desc, bias_ptr, out_ptr, M, N, K, CHUNK_K, stride_om, stride_on, HAS_BIAS: tl.constexpr,
                CHUNKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_M: tl.constexpr):
    """PB_GEMM_TMA (0410): pb_gemm with A [M, K] and the weight [N, K] read through TMA
    descriptors (rows and columns past the tensor read as zeros, as pb_gemm's masked loads give).
    The same chunks summed in the same order: CHUNK_K is a multiple of BLOCK_K, so a block never
    crosses a chunk's end."""
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % in_group) % group_rows
    tile_n = (pid % in_group) // group_rows
    row0, col0 = tile_m * BLOCK_M, tile_n * BLOCK_N
    if CHUNKED:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k_start in range(0, K, CHUNK_K):
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in range(k_start, tl.minimum(k_start + CHUNK_K, K), BLOCK_K):
                acc = tl.dot(a_desc.load([row0, k]), w_desc.load([col0, k]).T, acc)
            total += acc
    else:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            total = tl.dot(a_desc.load([row0, k]), w_desc.load([col0, k]).T, total)
    rows = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)
    cols = (col0 + tl.arange(0, BLOCK_N)).to(tl.int64)
    finish(total, bias_ptr, out_ptr, rows, cols, rows < M, cols < N, stride_om, stride_on, HAS_BIAS)


@triton.jit(do_not_specialize=["M"])
def pb_gemm_fp8(a_ptr, w_ptr, s_ptr, s_rows_ptr, bias_ptr, out_ptr, part_ptr, counter_ptr, M, N, K, CHUNK_K, k_offset,
                stride_am, stride_wn, stride_om, stride_on, stride_sn, stride_sk, HAS_BIAS: tl.constexpr,
                SPLIT: tl.constexpr, LAST_SUM: tl.constexpr, SCALE_K: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, STEP_SCALE: tl.constexpr):
    """0810: A [M, K] @ W'^T, W [N, K] float8 and W' its expansion with the scale grid s (the grid
    row of each of W's rows at s_rows, the grid column of k at (k + k_offset) // SCALE_K), summed
    in pb_gemm's chunks, each chunk as the transposed tile [BLOCK_N weight rows, BLOCK_M rows]
    (fp8_tiles.expanded_sum). SPLIT: one program a (column tile, row tile, chunk), its float32 sum
    into the parts [chunks, M, N] at part_ptr for pb_gemm_sum (LAST_SUM, 0950: the tile's last
    program adds them, as pb_gemm_chunks' does); else one program a tile adds its chunks to zero
    in order, as pb_gemm_sum does, adds the bias and stores. STEP_SCALE (0960): see
    fp8_tiles.expanded_sum."""
    tile_n, tile_m = tl.program_id(0), tl.program_id(1)
    cols = (tile_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rows = (tile_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    col_ok, row_ok = cols < N, rows < M
    s_rows = tl.load(s_rows_ptr + cols, mask=col_ok, other=0).to(tl.int64)
    mask = row_ok[None, :] & col_ok[:, None]
    if SPLIT:
        chunk = tl.program_id(2)
        k_start = chunk * CHUNK_K
        part = fp8_tiles.expanded_sum(w_ptr, a_ptr, s_ptr, cols, col_ok, s_rows, rows, row_ok, k_start,
                                      tl.minimum(k_start + CHUNK_K, K), k_offset, stride_wn, stride_am, stride_sn,
                                      stride_sk, SCALE_K, BLOCK_N, BLOCK_M, BLOCK_K, PRECISION, STEP_SCALE)
        offsets = rows[None, :] * N + cols[:, None]
        tl.store(part_ptr + chunk * M * N + offsets, part, mask=mask)
        if LAST_SUM:
            if last_of_tile(counter_ptr, tile_m * tl.num_programs(0) + tile_n, tl.num_programs(2)):
                total = parts_total(part_ptr, offsets, mask, tl.num_programs(2), M * N)
                finish_transposed(total, bias_ptr, out_ptr, rows, cols, col_ok, mask, stride_om, stride_on, HAS_BIAS)
    else:
        total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k_start in range(0, K, CHUNK_K):
            total += fp8_tiles.expanded_sum(w_ptr, a_ptr, s_ptr, cols, col_ok, s_rows, rows, row_ok, k_start,
                                            tl.minimum(k_start + CHUNK_K, K), k_offset, stride_wn, stride_am,
                                            stride_sn, stride_sk, SCALE_K, BLOCK_N, BLOCK_M, BLOCK_K, PRECISION,
                                            STEP_SCALE)
        finish_transposed(total, bias_ptr, out_ptr, rows, cols, col_ok, mask, stride_om, stride_on, HAS_BIAS)

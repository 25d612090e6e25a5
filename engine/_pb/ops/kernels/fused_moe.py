"""0220's kernels: the expert sort (`pb_moe_align`), the experts' gate/up product with the silu
gate (`pb_moe_gate_up`) and their down product weighted by the routing (`pb_moe_down`); the
launchers and the tiles in words: ops/fused_moe.py (and ops/moe_one_path.py for large steps)."""

import triton
import triton.language as tl

from . import fp8_tiles


@triton.jit
def pair_experts(index_ptr, p, n_pairs, num_experts):
    """The experts of pairs `p`, and which of them the sort keeps (in the step, routed to an expert
    of [0, num_experts))."""
    in_step = p < n_pairs
    e = tl.load(index_ptr + p, mask=in_step, other=num_experts).to(tl.int32)
    return e, in_step & (e >= 0) & (e < num_experts)


@triton.jit
def pb_moe_align(index_ptr, rows_ptr, block_expert_ptr, n_pairs, num_experts, max_blocks,
                 P: tl.constexpr, E: tl.constexpr, B: tl.constexpr, BM: tl.constexpr):
    # One program: P >= n_pairs, E >= num_experts, B >= max_blocks (powers of two).
    p = tl.arange(0, P)
    e, kept = pair_experts(index_ptr, p, n_pairs, num_experts)
    ex = tl.arange(0, E)
    hit = (e[None, :] == ex[:, None]) & kept[None, :]                       # [E, P]
    counts = tl.sum(hit.to(tl.int32), axis=1)
    padded = (counts + BM - 1) // BM * BM
    ends = tl.cumsum(padded, 0)
    starts = ends - padded
    start_of_pair = tl.sum(tl.where(hit, starts[:, None], 0), axis=0)        # [P]
    earlier_same = (e[:, None] == e[None, :]) & (p[None, :] < p[:, None])    # [P, P]
    rank = tl.sum(earlier_same.to(tl.int32), axis=1)
    slots = tl.arange(0, B * BM)
    tl.store(rows_ptr + slots, n_pairs, mask=slots < max_blocks * BM)
    tl.debug_barrier()
    tl.store(rows_ptr + start_of_pair + rank, p, mask=kept)
    b = tl.arange(0, B)
    first_row = b * BM
    expert_of_block = tl.sum((ends[None, :] <= first_row[:, None]).to(tl.int32), axis=1)  # [B, E]
    expert_of_block = tl.where(first_row < tl.sum(padded, 0), expert_of_block, -1)
    tl.store(block_expert_ptr + b, expert_of_block, mask=b < max_blocks)

@triton.jit(do_not_specialize=["n_pairs", "slots"])
def pb_moe_align_count(index_ptr, counts_ptr, rows_ptr, n_pairs, num_experts, slots, C: tl.constexpr,
                       E: tl.constexpr):
    # pb_moe_align past one program's pairs, in two launches of a program a chunk of C pairs; the
    # first: program c counts each expert's pairs among the chunk [c * C, (c + 1) * C) into
    # counts[c, :] and marks its share of the rows as padding
    c = tl.program_id(0)
    e, kept = pair_experts(index_ptr, c * C + tl.arange(0, C), n_pairs, num_experts)
    hit = (e[None, :] == tl.arange(0, E)[:, None]) & kept[None, :]               # [E, C]
    tl.store(counts_ptr + c * E + tl.arange(0, E), tl.sum(hit.to(tl.int32), axis=1))
    share = tl.cdiv(slots, tl.num_programs(0))
    stop = tl.minimum((c + 1) * share, slots)
    for first in range(c * share, stop, C):
        s = first + tl.arange(0, C)
        tl.store(rows_ptr + s, n_pairs, mask=s < stop)


@triton.jit(do_not_specialize=["n_pairs", "max_blocks"])
def pb_moe_align_place(index_ptr, counts_ptr, rows_ptr, block_expert_ptr, n_pairs, num_experts, max_blocks,
                       C: tl.constexpr, E: tl.constexpr, CH: tl.constexpr, BM: tl.constexpr):
    # the second launch: program c places its chunk's pairs, each after its expert's pairs of the
    # chunks before it (their counts) and of its own chunk before it, and writes its share of the
    # blocks' experts: the rows and blocks pb_moe_align writes (CH >= chunks, a power of two)
    c = tl.program_id(0)
    chunks = tl.num_programs(0)
    ch = tl.arange(0, CH)
    ex = tl.arange(0, E)
    table = tl.load(counts_ptr + ch[:, None] * E + ex[None, :], mask=(ch < chunks)[:, None], other=0)  # [CH, E]
    padded = (tl.sum(table, axis=0) + BM - 1) // BM * BM
    ends = tl.cumsum(padded, 0)
    taken = ends - padded + tl.sum(tl.where((ch < c)[:, None], table, 0), axis=0)
    p = c * C + tl.arange(0, C)
    e, kept = pair_experts(index_ptr, p, n_pairs, num_experts)
    hit = (e[None, :] == ex[:, None]) & kept[None, :]                           # [E, C]
    earlier_same = (e[:, None] == e[None, :]) & (p[None, :] < p[:, None])        # [C, C]
    rank = tl.sum(earlier_same.to(tl.int32), axis=1)
    tl.store(rows_ptr + tl.sum(tl.where(hit, taken[:, None], 0), axis=0) + rank, p, mask=kept)
    used_rows = tl.sum(padded, 0)
    share = tl.cdiv(max_blocks, chunks)
    stop = tl.minimum((c + 1) * share, max_blocks)
    for first in range(c * share, stop, C):
        b = first + tl.arange(0, C)
        first_row = b * BM
        expert_of_block = tl.sum((ends[None, :] <= first_row[:, None]).to(tl.int32), axis=1)  # [C, E]
        tl.store(block_expert_ptr + b, tl.where(first_row < used_rows, expert_of_block, -1), mask=b < stop)


@triton.jit
def pb_moe_gate_up(x_ptr, w_ptr, h_ptr, rows_ptr, block_expert_ptr, n_pairs, top_k, hidden, inter,
            stride_x, stride_we, stride_wn, stride_h,
            BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
            W_TMA: tl.constexpr = False):
    # W_TMA (0430): w_ptr is a TMA descriptor of the weights as [experts * 2 * inter, hidden]
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pairs = tl.load(rows_ptr + pid_m * BM + tl.arange(0, BM))
    valid = pairs < n_pairs
    tokens = tl.where(valid, pairs // top_k, 0)
    cols = pid_n * BN + tl.arange(0, BN)
    n_ok = cols < inter
    offs_n = tl.where(n_ok, cols, 0)  # for the weight loads; the store keeps `cols`, known contiguous
    x_rows = x_ptr + tokens[:, None].to(tl.int64) * stride_x
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    if W_TMA:  # the same values; rows past the expert's block land in columns that are not stored
        gate_row = expert * 2 * inter + pid_n * BN
        for k0 in range(0, hidden, BK):
            offs_k = k0 + tl.arange(0, BK)
            if EVEN_K:
                x = tl.load(x_rows + offs_k[None, :], mask=valid[:, None], other=0.0)
            else:
                x = tl.load(x_rows + offs_k[None, :], mask=valid[:, None] & (offs_k < hidden)[None, :], other=0.0)
            acc_g += tl.dot(x, w_ptr.load([gate_row, k0]).T)
            acc_u += tl.dot(x, w_ptr.load([gate_row + inter, k0]).T)
    else:
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        for k0 in range(0, hidden, BK):
            offs_k = k0 + tl.arange(0, BK)
            if EVEN_K:
                x = tl.load(x_rows + offs_k[None, :], mask=valid[:, None], other=0.0)
                wg = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None])
                wu = tl.load(w_base + (offs_n[None, :] + inter) * stride_wn + offs_k[:, None])
            else:
                k_ok = offs_k < hidden
                x = tl.load(x_rows + offs_k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                wg = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None], mask=k_ok[:, None], other=0.0)
                wu = tl.load(w_base + (offs_n[None, :] + inter) * stride_wn + offs_k[:, None],
                             mask=k_ok[:, None], other=0.0)
            acc_g += tl.dot(x, wg)
            acc_u += tl.dot(x, wu)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + pairs[:, None].to(tl.int64) * stride_h + cols[None, :], h.to(h_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])

@triton.jit
def pb_moe_down(h_ptr, w_ptr, y_ptr, rows_ptr, block_expert_ptr, weights_ptr, n_pairs, hidden, inter,
         stride_h, stride_we, stride_wn, stride_y,
         BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
         W_TMA: tl.constexpr = False):
    # W_TMA (0430): w_ptr is a TMA descriptor of the weights as [experts * hidden, inter]
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pairs = tl.load(rows_ptr + pid_m * BM + tl.arange(0, BM))
    valid = pairs < n_pairs
    safe = tl.where(valid, pairs, 0)
    cols = pid_n * BN + tl.arange(0, BN)
    n_ok = cols < hidden
    offs_n = tl.where(n_ok, cols, 0)  # for the weight loads; the store keeps `cols`, known contiguous
    h_rows = h_ptr + safe[:, None].to(tl.int64) * stride_h
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    if W_TMA:
        for k0 in range(0, inter, BK):
            offs_k = k0 + tl.arange(0, BK)
            if EVEN_K:
                h = tl.load(h_rows + offs_k[None, :], mask=valid[:, None], other=0.0)
            else:
                h = tl.load(h_rows + offs_k[None, :], mask=valid[:, None] & (offs_k < inter)[None, :], other=0.0)
            acc += tl.dot(h, w_ptr.load([expert * hidden + pid_n * BN, k0]).T)
    else:
        w_base = w_ptr + expert.to(tl.int64) * stride_we
        for k0 in range(0, inter, BK):
            offs_k = k0 + tl.arange(0, BK)
            if EVEN_K:
                h = tl.load(h_rows + offs_k[None, :], mask=valid[:, None], other=0.0)
                w = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None])
            else:
                k_ok = offs_k < inter
                h = tl.load(h_rows + offs_k[None, :], mask=valid[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None], mask=k_ok[:, None], other=0.0)
            acc += tl.dot(h, w)
    weight = tl.load(weights_ptr + safe, mask=valid, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    tl.store(y_ptr + pairs[:, None].to(tl.int64) * stride_y + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


@triton.jit
def pb_moe_gate_up_fp8(x_ptr, w_ptr, h_ptr, rows_ptr, block_expert_ptr, s_ptr, s_rows_ptr, n_pairs, top_k, hidden,
                       inter, k_offset, stride_x, stride_we, stride_wn, stride_h, stride_se, stride_sn, stride_sk,
                       SCALE_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       PRECISION: tl.constexpr, STEP_SCALE: tl.constexpr = False):
    # 0810: pb_moe_gate_up on float8 weights, each expanded with its block's scale
    # s[expert, s_rows[row], (k + k_offset) // SCALE_K], as transposed tiles [BN columns, BM pairs]
    # (STEP_SCALE, 0960: each step's sum scaled instead, fp8_tiles.expanded_sum)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pairs = tl.load(rows_ptr + pid_m * BM + tl.arange(0, BM))
    valid = pairs < n_pairs
    tokens = tl.where(valid, pairs // top_k, 0).to(tl.int64)
    cols = pid_n * BN + tl.arange(0, BN)
    n_ok = cols < inter
    gate = tl.where(n_ok, cols, 0).to(tl.int64)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    s_base = s_ptr + expert.to(tl.int64) * stride_se
    acc_g = fp8_tiles.expanded_sum(w_base, x_ptr, s_base, gate, n_ok, tl.load(s_rows_ptr + gate).to(tl.int64),
                                   tokens, valid, 0, hidden, k_offset, stride_wn, stride_x, stride_sn, stride_sk,
                                   SCALE_K, BN, BM, BK, PRECISION, STEP_SCALE)
    acc_u = fp8_tiles.expanded_sum(w_base, x_ptr, s_base, gate + inter, n_ok,
                                   tl.load(s_rows_ptr + gate + inter).to(tl.int64), tokens, valid, 0, hidden,
                                   k_offset, stride_wn, stride_x, stride_sn, stride_sk, SCALE_K, BN, BM, BK, PRECISION,
                                   STEP_SCALE)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + pairs[None, :].to(tl.int64) * stride_h + cols[:, None], h.to(h_ptr.dtype.element_ty),
             mask=valid[None, :] & n_ok[:, None])


@triton.jit
def pb_moe_down_fp8(h_ptr, w_ptr, y_ptr, rows_ptr, block_expert_ptr, weights_ptr, s_ptr, s_rows_ptr, n_pairs, hidden,
                    inter, k_offset, stride_h, stride_we, stride_wn, stride_y, stride_se, stride_sn, stride_sk,
                    SCALE_K: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    PRECISION: tl.constexpr, STEP_SCALE: tl.constexpr = False):
    # 0810: pb_moe_down on float8 weights, expanded as in pb_moe_gate_up_fp8
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pairs = tl.load(rows_ptr + pid_m * BM + tl.arange(0, BM))
    valid = pairs < n_pairs
    safe = tl.where(valid, pairs, 0)
    cols = pid_n * BN + tl.arange(0, BN)
    n_ok = cols < hidden
    out_rows = tl.where(n_ok, cols, 0).to(tl.int64)
    acc = fp8_tiles.expanded_sum(w_ptr + expert.to(tl.int64) * stride_we, h_ptr, s_ptr + expert.to(tl.int64) * stride_se,
                                 out_rows, n_ok, tl.load(s_rows_ptr + out_rows).to(tl.int64), safe.to(tl.int64), valid,
                                 0, inter, k_offset, stride_wn, stride_h, stride_sn, stride_sk, SCALE_K, BN, BM, BK,
                                 PRECISION, STEP_SCALE)
    weight = tl.load(weights_ptr + safe, mask=valid, other=0.0).to(tl.float32)
    acc = acc * weight[None, :]
    tl.store(y_ptr + pairs[None, :].to(tl.int64) * stride_y + cols[:, None], acc.to(y_ptr.dtype.element_ty),
             mask=valid[None, :] & n_ok[:, None])

"""PB_VARLEN_ATTENTION's Triton kernels (see varlen_attention.py), in a module of its own so that
upstream's sdpa integration, which imports varlen_attention, does not import Triton unless the
knob is on."""

import triton
import triton.language as tl


@triton.jit
def half_rows(q):
    """PB_KV_FP8 (0830): query rows in float16 for the products with e4m3 or int8 keys (whose widening to
    float16 is one instruction, where bfloat16 takes a detour through float32), each row scaled by
    the power of two that brings its largest magnitude into [2**14, 2**15); returns the rows and
    the powers that undo it [rows, 1]."""
    x = q.to(tl.float32)
    bits = tl.max(tl.abs(x), axis=1).to(tl.int32, bitcast=True)
    exponent = tl.where(bits == 0, 0, tl.minimum(tl.maximum(((bits >> 23) & 0xFF) - 141, -126), 126))
    up = ((127 - exponent) << 23).to(tl.float32, bitcast=True)
    down = ((127 + exponent) << 23).to(tl.float32, bitcast=True)
    return (x * up[:, None]).to(tl.float16), down[:, None]


@triton.jit
def row_scales(ks_ptr, vs_ptr, rows, stride_st, kv_head, col_ok, MASKED: tl.constexpr):
    """PB_KV_FP8 (0830): the float32 scales of a block's key and value rows (`rows` [BLOCK_N], the
    cache rows) for one KV head; rows past the sequence (col_ok false, MASKED) read 0."""
    offsets = rows * stride_st + kv_head
    if MASKED:
        return (tl.load(ks_ptr + offsets, mask=col_ok, other=0.0),
                tl.load(vs_ptr + offsets, mask=col_ok, other=0.0))
    return tl.load(ks_ptr + offsets), tl.load(vs_ptr + offsets)


@triton.jit
def key_block_fast(q, acc, m_i, l_i, k_desc, v_desc, row, start, k_len, kv_head, last, row_ok, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr):
    """key_block with PB_VARLEN_FAST (0400): keys and values come through TMA descriptors of the step's
    [tokens, KV heads, dim] keys and values (rows past the tensor read as zeros; values past the
    sequence are zeroed here, since they belong to another sequence), and the running softmax keeps
    the raw scores: m = max(raw) * scale, p = exp2(raw * scale - m), one FMA a score. `row`: the
    block's first key's row of the tensors the descriptors read."""
    cols = start + tl.arange(0, BLOCK_N)
    k = k_desc.load([row, kv_head, 0]).reshape(BLOCK_N, HEAD_DIM)
    v = v_desc.load([row, kv_head, 0]).reshape(BLOCK_N, HEAD_DIM)
    s = tl.dot(q, tl.trans(k))
    if MASKED:
        col_ok = cols < k_len
        v = tl.where(col_ok[:, None], v, 0.0)
        s = tl.where((cols[None, :] <= last[:, None]) & col_ok[None, :] & row_ok[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet stays empty
    else:  # every row sees every key of the block: its maximum is finite
        m_new = tl.maximum(m_i, tl.max(s, axis=1) * qk_scale)
        m_use = m_new
    p = tl.exp2(s * qk_scale - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
    return acc, m_new, l_i


@triton.jit
def key_block(q, acc, m_i, l_i, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_st, idx_ptr, start, k_start, k_len, kv_head, last,
              row_ok, qk_scale, stride_kt, stride_kh, stride_vt, stride_vh, HEAD_DIM: tl.constexpr,
              BLOCK_N: tl.constexpr, MASKED: tl.constexpr, INDEXED: tl.constexpr, KV_FP8: tl.constexpr):
    """One block of BLOCK_N keys from `start` into the running softmax (base-2 exponents). MASKED:
    some row of the block may not see some of these keys, or the block runs past the sequence.
    KV_FP8 (0830, decode rows): the keys and values are e4m3 (int8 with 0840: the pointers' type
    says which), widened exactly to float16 (q comes
    as half_rows' float16 rows and qk_scale carries their powers, [rows, 1]), each row's KV head
    with a power-of-two scale at ks_ptr / vs_ptr (row * stride_st + KV head): a key's scale
    multiplies its scores; a value's, over the block's largest, multiplies its weight p before the
    product with the values, and the block's largest multiplies the product."""
    dims = tl.arange(0, HEAD_DIM)
    cols = start + tl.arange(0, BLOCK_N)
    if INDEXED:  # 0750: each key's row of the cache, from the step's read index
        rows = tl.load(idx_ptr + k_start + cols, mask=cols < k_len, other=0).to(tl.int64)
    else:  # 64-bit offsets: a step's keys can pass 2**31 elements
        rows = (k_start + cols).to(tl.int64)
    k_rows = rows[:, None]
    kv_head = kv_head.to(tl.int64)
    if MASKED:
        col_ok = cols < k_len
        k = tl.load(k_ptr + k_rows * stride_kt + kv_head * stride_kh + dims[None, :], mask=col_ok[:, None], other=0.0)
        v = tl.load(v_ptr + k_rows * stride_vt + kv_head * stride_vh + dims[None, :], mask=col_ok[:, None], other=0.0)
    else:
        k = tl.load(k_ptr + k_rows * stride_kt + kv_head * stride_kh + dims[None, :])
        v = tl.load(v_ptr + k_rows * stride_vt + kv_head * stride_vh + dims[None, :])
    if KV_FP8:
        ks, vs = row_scales(ks_ptr, vs_ptr, rows, stride_st, kv_head, cols < k_len, MASKED)
        k, v = k.to(tl.float16), v.to(tl.float16)
        s = tl.dot(q, tl.trans(k)) * (qk_scale * ks[None, :])
    else:
        s = tl.dot(q, tl.trans(k)) * qk_scale
    if MASKED:
        s = tl.where((cols[None, :] <= last[:, None]) & col_ok[None, :] & row_ok[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet stays empty
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if KV_FP8:  # the weights over the block's largest value scale (a power of two: exact), in float16's range
        top = tl.max(vs, axis=0)
        inverse = ((254 << 23) - top.to(tl.int32, bitcast=True)).to(tl.float32, bitcast=True)
        acc = acc * alpha[:, None] + tl.dot((p * (vs * inverse)[None, :]).to(tl.float16), v) * top
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def attend(q, k_ptr, v_ptr, k_desc, v_desc, ks_ptr, vs_ptr, stride_st, idx_ptr, k_start, k_len, kv_head, seen_by_all,
           high, last, row_ok, scale, stride_kt, stride_kh, stride_vt, stride_vh, ROWS: tl.constexpr,
           HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, FAST: tl.constexpr, INDEXED: tl.constexpr,
           KV_FP8: tl.constexpr):
    """Flash attention's running softmax for `ROWS` query rows q over one sequence's keys [0, high)
    of one KV head, in blocks of BLOCK_N from its first key; row r sees the keys up to last[r].
    Every row sees the keys before `seen_by_all`, so whole blocks there skip the masks; a block
    gives a row the same bits through either loop. FAST: key_block_fast (TMA descriptors k_desc,
    v_desc; 0400), else key_block (pointers)."""
    qk_scale = scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
    if KV_FP8:
        q, powers = half_rows(q)
        qk_scale = qk_scale * powers
    m_i = tl.full((ROWS,), float("-inf"), dtype=tl.float32)
    l_i = tl.zeros((ROWS,), dtype=tl.float32)
    acc = tl.zeros((ROWS, HEAD_DIM), dtype=tl.float32)
    full = (tl.minimum(seen_by_all, high) // BLOCK_N) * BLOCK_N
    # FAST with INDEXED (0750): a block's first key's cache row is read one block ahead, so the
    # block's TMA loads never wait on the index (its BLOCK_N keys lie in one page: one run of rows)
    row = k_start
    if FAST and INDEXED:
        row = tl.load(idx_ptr + k_start).to(tl.int32)
    for start in range(0, full, BLOCK_N):
        if FAST:
            this_row = k_start + start
            if INDEXED:
                this_row = row
                row = tl.load(idx_ptr + k_start + tl.minimum(start + BLOCK_N, k_len - 1)).to(tl.int32)
            acc, m_i, l_i = key_block_fast(q, acc, m_i, l_i, k_desc, v_desc, this_row, start, k_len, kv_head,
                                           last, row_ok, qk_scale, HEAD_DIM, BLOCK_N, False)
        else:
            acc, m_i, l_i = key_block(q, acc, m_i, l_i, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_st, idx_ptr, start,
                                      k_start, k_len, kv_head, last, row_ok, qk_scale, stride_kt, stride_kh, stride_vt,
                                      stride_vh, HEAD_DIM, BLOCK_N, False, INDEXED, KV_FP8)
    for start in range(full, high, BLOCK_N):
        if FAST:
            this_row = k_start + start
            if INDEXED:
                this_row = row
                row = tl.load(idx_ptr + k_start + tl.minimum(start + BLOCK_N, k_len - 1)).to(tl.int32)
            acc, m_i, l_i = key_block_fast(q, acc, m_i, l_i, k_desc, v_desc, this_row, start, k_len, kv_head,
                                           last, row_ok, qk_scale, HEAD_DIM, BLOCK_N, True)
        else:
            acc, m_i, l_i = key_block(q, acc, m_i, l_i, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_st, idx_ptr, start,
                                      k_start, k_len, kv_head, last, row_ok, qk_scale, stride_kt, stride_kh, stride_vt,
                                      stride_vh, HEAD_DIM, BLOCK_N, True, INDEXED, KV_FP8)
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit
def query_blocks(cu_q_ptr, first_seq, sequences, SEQ_P2: tl.constexpr, BLOCK_M: tl.constexpr):
    """The query blocks of the sequences first_seq ... first_seq + SEQ_P2 - 1 (int32; none past
    `sequences`, none for a sequence of one query token, which the decode kernels take), and
    which of them exist."""
    seq_ids = first_seq + tl.arange(0, SEQ_P2)
    ok = seq_ids < sequences
    lengths = tl.load(cu_q_ptr + seq_ids + 1, mask=ok, other=0) - tl.load(cu_q_ptr + seq_ids, mask=ok, other=0)
    return tl.where(lengths > 1, (lengths + BLOCK_M - 1) // BLOCK_M, 0).to(tl.int32), ok


@triton.jit
def step_blocks(cu_q_ptr, block_end_ptr, sequences, SEQ_P2: tl.constexpr, BLOCK_M: tl.constexpr,
                COUNT: tl.constexpr):
    """The query blocks of the whole step: the last of block_end, or with COUNT (0950) summed from cu_q."""
    if COUNT:
        total = tl.zeros((), dtype=tl.int32)
        for first_seq in range(0, sequences, SEQ_P2):
            blocks, _ = query_blocks(cu_q_ptr, first_seq, sequences, SEQ_P2, BLOCK_M)
            total += tl.sum(blocks, axis=0)
    else:
        total = tl.load(block_end_ptr + sequences - 1)
    return total


@triton.jit
def block_owner(pid, cu_q_ptr, block_end_ptr, sequences, SEQ_P2: tl.constexpr, BLOCK_M: tl.constexpr,
                COUNT: tl.constexpr):
    """The sequence query block `pid` belongs to (`sequences` past the step's last block) and the
    blocks of the sequences before it: how many sequences' blocks end at or before it, counted
    SEQ_P2 sequences at a time (one pass unless PB_STABLE_LAUNCH fixes SEQ_P2). The ends are read
    from block_end (the host's running sum), or with COUNT (0950) summed from cu_q here by
    count_past (past the step's last block `seq` counts the padding too, still `sequences` or more)."""
    seq = tl.zeros((), dtype=tl.int32)
    before = tl.zeros((), dtype=tl.int32)
    seen = tl.zeros((), dtype=tl.int32)
    for first_seq in range(0, sequences, SEQ_P2):
        if COUNT:
            blocks, _ = query_blocks(cu_q_ptr, first_seq, sequences, SEQ_P2, BLOCK_M)
            seq, before, seen = count_past(pid, blocks, seq, before, seen)
        else:
            seq_ids = first_seq + tl.arange(0, SEQ_P2)
            ends = tl.load(block_end_ptr + seq_ids, mask=seq_ids < sequences, other=2147483647)
            seq += tl.sum((ends <= pid).to(tl.int32), axis=0)
    if not COUNT:
        before = tl.load(block_end_ptr + seq - 1, mask=seq > 0, other=0)
    return seq, before


@triton.jit
def prompt_block(pid, q_ptr, k_ptr, v_ptr, out_ptr, k_desc, v_desc, idx_ptr, cu_q_ptr, cu_k_ptr, block_end_ptr, head,
                 sequences, scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot,
                 stride_oh, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, SEQ_P2: tl.constexpr, FAST: tl.constexpr, INDEXED: tl.constexpr,
                 COUNT: tl.constexpr):
    """The step's query block number `pid` (blocks numbered over the sequences in order) for one
    head; nothing where the step has fewer blocks."""
    seq, before = block_owner(pid, cu_q_ptr, block_end_ptr, sequences, SEQ_P2, BLOCK_M, COUNT)
    if seq < sequences:
        block = pid - before
        q_start = tl.load(cu_q_ptr + seq)
        q_len = tl.load(cu_q_ptr + seq + 1) - q_start
        k_start = tl.load(cu_k_ptr + seq)
        k_len = tl.load(cu_k_ptr + seq + 1) - k_start
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < q_len
        dims = tl.arange(0, HEAD_DIM)
        q_rows = (q_start + rows).to(tl.int64)[:, None]
        q = tl.load(q_ptr + q_rows * stride_qt + head.to(tl.int64) * stride_qh + dims[None, :],
                    mask=row_ok[:, None], other=0.0)
        # a row sees its sequence's keys up to its own position (the cached ones before the step too)
        high = tl.minimum(k_len, (block + 1) * BLOCK_M + (k_len - q_len))
        first = block * BLOCK_M + (k_len - q_len)  # the block's first row's last key: every row sees up to it
        out = attend(q, k_ptr, v_ptr, k_desc, v_desc, k_ptr, v_ptr, 0, idx_ptr, k_start, k_len, head // GROUPS,
                     first + 1, high, rows + (k_len - q_len), row_ok, scale, stride_kt, stride_kh, stride_vt, stride_vh,
                     BLOCK_M, HEAD_DIM, BLOCK_N, FAST, INDEXED, False)
        tl.store(out_ptr + q_rows * stride_ot + head.to(tl.int64) * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def pb_varlen_attention(q_ptr, k_ptr, v_ptr, out_ptr, k_desc, v_desc, idx_ptr, cu_q_ptr, cu_k_ptr, block_end_ptr,
                        sequences, scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot,
                        stride_oh, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, SEQ_P2: tl.constexpr, FAST: tl.constexpr, INDEXED: tl.constexpr,
                        TURNS: tl.constexpr = False, COUNT: tl.constexpr = False):
    """Sequences of more than one query token: one program takes one block of BLOCK_M query rows
    of one sequence for one head. The grid is (heads, blocks) taken in reverse block order: every
    head of the step's last block first, so the blocks with the most keys start early and the
    query heads sharing a KV head run side by side (their keys stay in cache). FAST (0400): keys and
    values through the TMA descriptors k_desc, v_desc (otherwise unused). TURNS (0940): the grid's
    second side is smaller than the step's blocks may be; its programs take the step's blocks
    (their count read from block_end) in turn, in the same reverse order, each block as above.
    COUNT (0950): the blocks are counted from cu_q here (block_end is not read), not by the host's
    torch launches."""
    head = tl.program_id(0)
    if TURNS:
        total = step_blocks(cu_q_ptr, block_end_ptr, sequences, SEQ_P2, BLOCK_M, COUNT)
        for turn in range(tl.program_id(1), total, tl.num_programs(1)):
            prompt_block(total - 1 - turn, q_ptr, k_ptr, v_ptr, out_ptr, k_desc, v_desc, idx_ptr, cu_q_ptr, cu_k_ptr,
                         block_end_ptr, head, sequences, scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt,
                         stride_vh, stride_ot, stride_oh, GROUPS, HEAD_DIM, BLOCK_M, BLOCK_N, SEQ_P2, FAST, INDEXED,
                         COUNT)
    else:
        prompt_block(tl.num_programs(1) - 1 - tl.program_id(1), q_ptr, k_ptr, v_ptr, out_ptr, k_desc, v_desc, idx_ptr,
                     cu_q_ptr, cu_k_ptr, block_end_ptr, head, sequences, scale, stride_qt, stride_qh, stride_kt,
                     stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, GROUPS, HEAD_DIM, BLOCK_M, BLOCK_N, SEQ_P2,
                     FAST, INDEXED, COUNT)


@triton.jit
def pb_varlen_attention_decode(q_ptr, k_ptr, v_ptr, out_ptr, ks_ptr, vs_ptr, stride_st, idx_ptr, cu_q_ptr, cu_k_ptr,
                               scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot,
                               stride_oh, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                               BLOCK_N: tl.constexpr, INDEXED: tl.constexpr, KV_FP8: tl.constexpr):
    """A sequence with one query token: one program takes the query heads that share one KV head
    (the rows of its dots) and walks the sequence's keys once for all of them."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_start = tl.load(cu_q_ptr + seq)
    if tl.load(cu_q_ptr + seq + 1) - q_start == 1:
        k_start = tl.load(cu_k_ptr + seq)
        k_len = tl.load(cu_k_ptr + seq + 1) - k_start
        group = tl.arange(0, BLOCK_H)
        group_ok = group < GROUPS
        heads = kv_head * GROUPS + group
        dims = tl.arange(0, HEAD_DIM)
        q_row = q_start.to(tl.int64)
        heads = heads.to(tl.int64)
        q = tl.load(q_ptr + q_row * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                    mask=group_ok[:, None], other=0.0)
        last = tl.full((BLOCK_H,), 0, dtype=tl.int32) + (k_len - 1)  # the one query token is the last
        out = attend(q, k_ptr, v_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_st, idx_ptr, k_start, k_len, kv_head, k_len,
                     k_len, last, group_ok, scale, stride_kt, stride_kh, stride_vt, stride_vh, BLOCK_H, HEAD_DIM,
                     BLOCK_N, False, INDEXED, KV_FP8)
        tl.store(out_ptr + q_row * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=group_ok[:, None])


@triton.jit
def count_past(item, counts, seq, before, seen):
    """One chunk of sequences in the search for the sequence whose numbered items hold `item` (the
    items numbered over the sequences in order, `counts` [chunk] of them a sequence): the
    sequences wholly before it (`seq`), their items (`before`) and every item counted so far
    (`seen`), each carried over the chunks."""
    passed = (seen + tl.cumsum(counts, axis=0)) <= item
    seq += tl.sum(passed.to(tl.int32), axis=0)
    before += tl.sum(tl.where(passed, counts, 0), axis=0)
    seen += tl.sum(counts, axis=0)
    return seq, before, seen


@triton.jit
def decode_parts(cu_q_ptr, cu_k_ptr, ids, sequences, BLOCK_N: tl.constexpr, PART_BLOCKS: tl.constexpr,
                 MAX_PARTS: tl.constexpr):
    """PB_SPLIT_DECODE (0740): for the sequences `ids`, how many parts a decode row's keys are split
    into and how many key blocks a part takes (its last part may take fewer); 0 parts for a
    sequence of more than one query token, or none (padding). Both follow from the sequence's own
    key count only: about PART_BLOCKS blocks a part, at most MAX_PARTS parts, none empty."""
    ok = ids < sequences
    q_len = tl.load(cu_q_ptr + ids + 1, mask=ok, other=0) - tl.load(cu_q_ptr + ids, mask=ok, other=0)
    k_len = tl.load(cu_k_ptr + ids + 1, mask=ok, other=0) - tl.load(cu_k_ptr + ids, mask=ok, other=0)
    blocks = (k_len + BLOCK_N - 1) // BLOCK_N
    wanted = tl.maximum(tl.minimum((blocks + PART_BLOCKS - 1) // PART_BLOCKS, MAX_PARTS), 1)
    per_part = tl.maximum((blocks + wanted - 1) // wanted, 1)
    parts = tl.where(ok & (q_len == 1), (blocks + per_part - 1) // per_part, 0)
    return parts, per_part


@triton.jit
def pb_varlen_attention_decode_parts(q_ptr, k_ptr, v_ptr, acc_ptr, ml_ptr, ks_ptr, vs_ptr, stride_st, idx_ptr,
                                     cu_q_ptr, cu_k_ptr, sequences, scale, stride_qt, stride_qh, stride_kt, stride_kh,
                                     stride_vt, stride_vh, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
                                     BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, PART_BLOCKS: tl.constexpr,
                                     MAX_PARTS: tl.constexpr, SEQ_CHUNK: tl.constexpr, PROGRAMS: tl.constexpr,
                                     INDEXED: tl.constexpr, KV_FP8: tl.constexpr):
    """PB_SPLIT_DECODE (0740): the decode rows' keys in parts. The step's parts are numbered in
    sequence order (a sequence's in key order); program (kv_head, p) takes parts p, p + PROGRAMS,
    ... of its KV head. A part runs 0370's running softmax over its own key blocks for the query
    heads that share the KV head, and leaves its maxima, sums and unnormalised outputs (float32)
    at its number for the combine. Which program takes a part changes nothing in its bits."""
    kv_head = tl.program_id(0)
    kv_heads = tl.num_programs(0)
    total = tl.zeros((), dtype=tl.int32)
    for first in range(0, sequences, SEQ_CHUNK):
        counted, counted_size = decode_parts(cu_q_ptr, cu_k_ptr, first + tl.arange(0, SEQ_CHUNK), sequences,
                                             BLOCK_N, PART_BLOCKS, MAX_PARTS)
        total += tl.sum(counted, axis=0)
    group = tl.arange(0, BLOCK_H)
    group_ok = group < GROUPS
    dims = tl.arange(0, HEAD_DIM)
    heads = (kv_head * GROUPS + group).to(tl.int64)
    qk_scale = scale * 1.4426950408889634  # exp(x) = exp2(x * log2(e))
    for item in range(tl.program_id(1), total, PROGRAMS):
        # the sequence whose parts hold this number: those whose parts all come before it, counted
        seq = tl.zeros((), dtype=tl.int32)
        before = tl.zeros((), dtype=tl.int32)  # the parts of the sequences before it
        seen = tl.zeros((), dtype=tl.int32)
        for first in range(0, sequences, SEQ_CHUNK):
            chunk_parts, chunk_sizes = decode_parts(cu_q_ptr, cu_k_ptr, first + tl.arange(0, SEQ_CHUNK), sequences,
                                                    BLOCK_N, PART_BLOCKS, MAX_PARTS)
            seq, before, seen = count_past(item, chunk_parts, seq, before, seen)
        row_parts, per_part = decode_parts(cu_q_ptr, cu_k_ptr, seq, sequences, BLOCK_N, PART_BLOCKS, MAX_PARTS)
        k_start = tl.load(cu_k_ptr + seq)
        k_len = tl.load(cu_k_ptr + seq + 1) - k_start
        low = (item - before) * per_part * BLOCK_N
        high = tl.minimum(low + per_part * BLOCK_N, k_len)
        full = tl.minimum(high, (k_len // BLOCK_N) * BLOCK_N)  # blocks before it lie wholly in the sequence
        q_row = tl.load(cu_q_ptr + seq).to(tl.int64)
        q = tl.load(q_ptr + q_row * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                    mask=group_ok[:, None], other=0.0)
        row_scale = qk_scale
        if KV_FP8:
            q, powers = half_rows(q)
            row_scale = qk_scale * powers
        last = tl.full((BLOCK_H,), 0, dtype=tl.int32) + (k_len - 1)  # the one query token is the last
        m_i = tl.full((BLOCK_H,), float("-inf"), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_H,), dtype=tl.float32)
        acc = tl.zeros((BLOCK_H, HEAD_DIM), dtype=tl.float32)
        for start in range(low, full, BLOCK_N):
            acc, m_i, l_i = key_block(q, acc, m_i, l_i, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_st, idx_ptr, start,
                                      k_start, k_len, kv_head, last, group_ok, row_scale, stride_kt, stride_kh,
                                      stride_vt, stride_vh, HEAD_DIM, BLOCK_N, False, INDEXED, KV_FP8)
        for start in range(full, high, BLOCK_N):
            acc, m_i, l_i = key_block(q, acc, m_i, l_i, k_ptr, v_ptr, ks_ptr, vs_ptr, stride_st, idx_ptr, start,
                                      k_start, k_len, kv_head, last, group_ok, row_scale, stride_kt, stride_kh,
                                      stride_vt, stride_vh, HEAD_DIM, BLOCK_N, True, INDEXED, KV_FP8)
        slot = (item * kv_heads + kv_head).to(tl.int64)
        tl.store(acc_ptr + (slot * BLOCK_H + group[:, None]) * HEAD_DIM + dims[None, :], acc)
        tl.store(ml_ptr + slot * 2 * BLOCK_H + group, m_i)
        tl.store(ml_ptr + slot * 2 * BLOCK_H + BLOCK_H + group, l_i)


@triton.jit
def merge_parts(out_ptr, acc_ptr, ml_ptr, out_row, first_part, parts, kv_heads, kv_head, group, stride_oh,
                GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, MAX_PARTS: tl.constexpr):
    """One query head of one decode row: its parts (numbered from first_part) merged into its output
    row out_row (already offset to the row): the largest maximum M, each part's weight
    exp2(m - M), then the weighted sums over MAX_PARTS slots (parts past the row's weigh 0) in the
    reduction's fixed order."""
    index = tl.arange(0, MAX_PARTS)
    used = index < parts
    slots = ((first_part + index) * kv_heads + kv_head).to(tl.int64)
    m = tl.load(ml_ptr + slots * 2 * BLOCK_H + group, mask=used, other=float("-inf"))
    l_part = tl.load(ml_ptr + slots * 2 * BLOCK_H + BLOCK_H + group, mask=used, other=0.0)
    dims = tl.arange(0, HEAD_DIM)
    acc = tl.load(acc_ptr + (slots[:, None] * BLOCK_H + group) * HEAD_DIM + dims[None, :], mask=used[:, None],
                  other=0.0)
    top = tl.max(m, axis=0)
    top = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.where(used, tl.exp2(m - top), 0.0)
    total = tl.sum(l_part * weight, axis=0)
    out = tl.sum(acc * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    head = (kv_head * GROUPS + group).to(tl.int64)
    tl.store(out_ptr + out_row + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty))


@triton.jit
def pb_varlen_attention_decode_combine(out_ptr, acc_ptr, ml_ptr, cu_q_ptr, cu_k_ptr, sequences, stride_ot, stride_oh,
                                       GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                                       BLOCK_N: tl.constexpr, PART_BLOCKS: tl.constexpr, MAX_PARTS: tl.constexpr,
                                       SEQ_CHUNK: tl.constexpr, ALL_GROUPS: tl.constexpr = False):
    """PB_SPLIT_DECODE (0740): one program a decode row and query head (grid (sequences, query
    heads)) merges the row's parts into its output, all parts at once (merge_parts). ALL_GROUPS
    (0940): one program a decode row and KV head (grid (sequences, KV heads)) merges them for each
    of the KV head's query heads in turn, by the same code: the same bits, with the row's first part
    found once. A row of one part gets 0370's bits: its sums are scaled by exactly 1 and added to
    zeros."""
    seq = tl.program_id(0)
    parts, per_part = decode_parts(cu_q_ptr, cu_k_ptr, seq, sequences, BLOCK_N, PART_BLOCKS, MAX_PARTS)
    if parts > 0:
        first_part = tl.zeros((), dtype=tl.int32)
        for first in range(0, seq, SEQ_CHUNK):
            ids = first + tl.arange(0, SEQ_CHUNK)
            counts, sizes = decode_parts(cu_q_ptr, cu_k_ptr, ids, sequences, BLOCK_N, PART_BLOCKS, MAX_PARTS)
            first_part += tl.sum(tl.where(ids < seq, counts, 0), axis=0)
        out_row = tl.load(cu_q_ptr + seq).to(tl.int64) * stride_ot
        if ALL_GROUPS:
            kv_head = tl.program_id(1)
            for group in range(0, GROUPS):
                merge_parts(out_ptr, acc_ptr, ml_ptr, out_row, first_part, parts, tl.num_programs(1), kv_head, group,
                            stride_oh, GROUPS, HEAD_DIM, BLOCK_H, MAX_PARTS)
        else:
            head = tl.program_id(1)
            merge_parts(out_ptr, acc_ptr, ml_ptr, out_row, first_part, parts, tl.num_programs(1) // GROUPS,
                        head // GROUPS, head % GROUPS, stride_oh, GROUPS, HEAD_DIM, BLOCK_H, MAX_PARTS)


@triton.jit
def pb_kv_write(k_ptr, v_ptr, kc_ptr, vc_ptr, idx_ptr, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct,
                stride_ch, KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr):
    """PB_FEWER_LAUNCHES (0950) with PB_CACHE_READ (0750): one program a token copies its keys and
    its values [KV heads, dim] to their cache rows index[token], the bytes two index_copy_ calls
    write."""
    token = tl.program_id(0).to(tl.int64)
    row = tl.load(idx_ptr + token).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HEAD_DIM)
    ok = (heads < KV_HEADS)[:, None]
    cache = row * stride_ct + heads[:, None] * stride_ch + dims[None, :]
    k = tl.load(k_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :], mask=ok)
    v = tl.load(v_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=ok)
    tl.store(kc_ptr + cache, k, mask=ok)
    tl.store(vc_ptr + cache, v, mask=ok)

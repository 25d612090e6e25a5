"""On an H200: (1) 0370's prompt kernel on one cold 8K sequence (air12's 96 heads / 8 KV heads, dim 128)
at several launch settings and program orders, against cuDNN's and flash's causal sdpa; bits compared
between settings of the same BLOCK_N. (2) 0380's float32 router GEMM [m, 4096] @ [4096, 128] with more
chunks and with tf32x3 against cuBLAS. Writes OUT/attn_tune.json."""
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, "src")
from transformers._pb.varlen_attention_kernel import attend  # noqa: E402

out_dir = sys.argv[1]
res = {"attention": [], "router": []}


@triton.jit
def prompt_kernel(q_ptr, k_ptr, v_ptr, out_ptr, cu_q_ptr, cu_k_ptr, block_end_ptr, sequences, scale,
                  stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                  GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, SEQ_P2: tl.constexpr, HEADS_FIRST: tl.constexpr):
    if HEADS_FIRST:  # grid (heads, blocks): every head of the last (heaviest) block first
        head = tl.program_id(0)
        pid = tl.num_programs(1) - 1 - tl.program_id(1)
    else:
        pid = tl.program_id(0)
        head = tl.program_id(1)
    seq_ids = tl.arange(0, SEQ_P2)
    ends = tl.load(block_end_ptr + seq_ids, mask=seq_ids < sequences, other=2147483647)
    seq = tl.sum((ends <= pid).to(tl.int32), axis=0)
    if seq < sequences:
        block = pid - tl.load(block_end_ptr + seq - 1, mask=seq > 0, other=0)
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
        high = tl.minimum(k_len, (block + 1) * BLOCK_M + (k_len - q_len))
        first = block * BLOCK_M + (k_len - q_len)
        out = attend(q, k_ptr, v_ptr, k_start, k_len, head // GROUPS, first + 1, high, rows + (k_len - q_len),
                     row_ok, scale, stride_kt, stride_kh, stride_vt, stride_vh, BLOCK_M, HEAD_DIM, BLOCK_N)
        tl.store(out_ptr + q_rows * stride_ot + head.to(tl.int64) * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"  # the CPU only to check this script under TRITON_INTERPRET=1
DT = torch.bfloat16 if CUDA else torch.float16  # the interpreter's bf16 dots are broken here


def timed(fn, reps=20):
    if not CUDA:
        fn()
        return 0.0
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


torch.manual_seed(0)
T, H, KVH, D = (8192, 96, 8, 128) if CUDA else (300, 24, 2, 32)
q = torch.randn(T, H, D, device=DEV, dtype=DT)
k = torch.randn(T, KVH, D, device=DEV, dtype=DT)
v = torch.randn(T, KVH, D, device=DEV, dtype=DT)
cu = torch.tensor([0, T], device=DEV, dtype=torch.int32)
scale = D ** -0.5


def run(bm, bn, warps, stages, heads_first):
    out = torch.zeros((T, H, D), dtype=q.dtype, device=q.device)
    block_end = torch.tensor([-(-T // bm)], device=DEV, dtype=torch.int32)
    blocks = -(-T // bm) + 1
    grid = (H, blocks) if heads_first else (blocks, H)
    prompt_kernel[grid](q, k, v, out, cu, cu, block_end, 1, scale, q.stride(0), q.stride(1), k.stride(0),
                        k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1), GROUPS=H // KVH,
                        HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, SEQ_P2=16, HEADS_FIRST=heads_first,
                        num_warps=warps, num_stages=stages)
    return out


qs, ks, vs = q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

ref = None
for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
    try:
        with sdpa_kernel(backend):
            fn = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=True)  # noqa: E731
            ms = timed(fn)
            o = fn()[0].transpose(0, 1)
        if ref is None:
            ref = o
        res["attention"].append({"cfg": name, "ms": ms})
    except Exception as e:  # noqa: BLE001
        res["attention"].append({"cfg": name, "error": str(e)[:300]})
    print(res["attention"][-1], flush=True)

base = {}
for bm, bn, warps, stages, hf in [(128, 64, 8, 3, False), (128, 64, 8, 3, True), (128, 64, 8, 2, True),
                                  (128, 64, 8, 4, True), (128, 64, 4, 3, True), (64, 64, 4, 3, True),
                                  (128, 128, 8, 3, False), (128, 128, 8, 3, True), (128, 128, 8, 2, True),
                                  (64, 128, 4, 3, True), (128, 32, 8, 3, True), (128, 32, 4, 3, True)]:
    cfg = [bm, bn, warps, stages, hf]
    try:
        o = run(bm, bn, warps, stages, hf)
        ms = timed(lambda: run(bm, bn, warps, stages, hf))
        entry = {"cfg": cfg, "ms": ms, "max_abs_vs_sdpa": float((o.float() - ref.float()).abs().max())}
        if bn in base:
            entry["same_bits_as_first_of_block_n"] = bool(torch.equal(o, base[bn]))
        else:
            base[bn] = o
        res["attention"].append(entry)
    except Exception as e:  # noqa: BLE001
        res["attention"].append({"cfg": cfg, "error": str(e)[:300]})
    print(res["attention"][-1], flush=True)
del q, k, v, qs, ks, vs, base, ref

# (2) the router's float32 GEMM
from transformers._pb import invariant_gemm as ig  # noqa: E402
from transformers._pb.invariant_gemm_kernel import pb_gemm, pb_gemm_chunks, pb_gemm_sum  # noqa: E402

w = torch.randn(128, 4096 if CUDA else 256, device=DEV, dtype=DT) * 0.02


def gemm(a, b, chunks_max, precision, block_n, force_chunks, sum_rows=32):
    (m, kk), n = a.shape, b.shape[1]
    out = torch.empty((m, n), dtype=torch.float32, device=a.device)
    blocks = -(-kk // 64)
    chunks = min(blocks, chunks_max)
    step = -(-blocks // chunks) * 64
    chunks = -(-kk // step)
    t = ig.tiles(m, n, a.dtype)
    bm = t.m
    tiles_m, tiles_n = -(-m // bm), -(-n // block_n)
    if force_chunks or (m <= 256 and tiles_m * tiles_n < 256):
        parts = torch.empty((chunks, m, n), dtype=torch.float32, device=a.device)
        pb_gemm_chunks[(tiles_m, tiles_n, chunks)](a, b, parts, m, n, kk, step, a.stride(0), a.stride(1), b.stride(0),
                                                   b.stride(1), BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=64,
                                                   PRECISION=precision, num_warps=t.warps, num_stages=t.stages)
        pb_gemm_sum[(-(-m // sum_rows), tiles_n)](parts, out, out, m, n, chunks, out.stride(0), out.stride(1),
                                                  HAS_BIAS=False, BLOCK_M=sum_rows, BLOCK_N=block_n, num_warps=4)
    else:
        pb_gemm[(tiles_m * tiles_n,)](a, b, out, out, m, n, kk, step, a.stride(0), a.stride(1), b.stride(0),
                                      b.stride(1), out.stride(0), out.stride(1), HAS_BIAS=False, BLOCK_M=bm,
                                      BLOCK_N=block_n, BLOCK_K=64, GROUP_M=8, PRECISION=precision,
                                      num_warps=t.warps, num_stages=t.stages)
    return out


# (1b) the decode kernel: 1 and 32 sequences of 8K keys, at BLOCK_N 32 / 64 / 128
from transformers._pb.varlen_attention_kernel import pb_varlen_attention_decode  # noqa: E402

for seqs in (1, 32):
    kk = torch.randn(seqs * T, KVH, D, device=DEV, dtype=DT)
    vv = torch.randn(seqs * T, KVH, D, device=DEV, dtype=DT)
    qq = torch.randn(seqs, H, D, device=DEV, dtype=DT)
    cq = torch.arange(seqs + 1, device=DEV, dtype=torch.int32)
    ck = cq * T
    for bn in (32, 64, 128):
        o = torch.zeros_like(qq)
        fn = lambda: pb_varlen_attention_decode[(seqs, KVH)](  # noqa: E731
            qq, kk, vv, o, cq, ck, scale, qq.stride(0), qq.stride(1), kk.stride(0), kk.stride(1), vv.stride(0),
            vv.stride(1), o.stride(0), o.stride(1), GROUPS=H // KVH, HEAD_DIM=D, BLOCK_H=max(16, H // KVH),
            BLOCK_N=bn, num_warps=4)
        try:
            res["attention"].append({"decode_seqs": seqs, "block_n": bn, "ms": timed(fn)})
        except Exception as e:  # noqa: BLE001
            res["attention"].append({"decode_seqs": seqs, "block_n": bn, "error": str(e)[:300]})
        print(res["attention"][-1], flush=True)
    del kk, vv

for m in ((1, 8, 64, 512, 8192) if CUDA else (1, 70)):
    x = torch.randn(m, w.shape[1], device=DEV, dtype=DT)
    xf, wf = x.float(), w.float()
    row = {"m": m, "cublas_ms": timed(lambda: F.linear(xf, wf)), "cublas_with_casts_ms": timed(lambda: F.linear(x.float(), w.float()))}
    exact = F.linear(x.double(), w.double())
    row["cublas_err"] = float((F.linear(xf, wf).double() - exact).abs().max())
    for chunks_max, precision, block_n, force in [(16, "bf16", 32, True), (16, "bf16", 128, True),
                                                  (64, "bf16", 32, True), (32, "bf16", 16, True), (16, "bf16", 16, True),
                                                  (16, "bf16", 128, False), (1, "bf16", 16, True), (1, "bf16", 32, False),(16, "ieee", 128, False), (64, "ieee", 128, False),
                                                  (64, "ieee", 32, False), (64, "ieee", 32, True),
                                                  (16, "tf32x3", 128, False), (64, "tf32x3", 32, True),
                                                  (64, "tf32x3", 64, True), (16, "tf32x3", 128, True)]:
        key = f"c{chunks_max}-{precision}-n{block_n}{'-chunks' if force else ''}"
        xa, wa, prec = (x, w, "ieee") if precision == "bf16" else (xf, wf, precision)
        try:
            o = gemm(xa, wa.t(), chunks_max, prec, block_n, force)
            row[key + "_ms"] = timed(lambda: gemm(xa, wa.t(), chunks_max, prec, block_n, force))
            row[key + "_err"] = float((o.double() - exact).abs().max())
            o1 = gemm(xa[:1], wa.t(), chunks_max, prec, block_n, force)
            row[key + "_row0_same_as_alone"] = bool(torch.equal(o1[0], o[0]))
        except Exception as e:  # noqa: BLE001
            row[key + "_error"] = str(e)[:200]
    res["router"].append(row)
    print(row, flush=True)

json.dump(res, open(f"{out_dir}/attn_tune.json", "w"), indent=1)

# (3) dense GEMMs at a prompt's row count with one accumulator over the whole K (no chunks)
res["dense"] = []


@triton.jit
def plain_gemm(a_ptr, b_ptr, c_ptr, M, N, K, sam, sak, sbk, sbn, scm, scn, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BM), tl.cdiv(N, BN)
    in_group = GROUP_M * tiles_n
    first_m = (pid // in_group) * GROUP_M
    group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
    pm = first_m + (pid % in_group) % group_rows
    pn = (pid % in_group) // group_rows
    rows = (pm * BM + tl.arange(0, BM)).to(tl.int64)
    cols = (pn * BN + tl.arange(0, BN)).to(tl.int64)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, K, BK):
        ks = (k + tl.arange(0, BK)).to(tl.int64)
        a = tl.load(a_ptr + rows[:, None] * sam + ks[None, :] * sak, mask=(rows[:, None] < M) & (ks[None, :] < K), other=0.0)
        b = tl.load(b_ptr + ks[:, None] * sbk + cols[None, :] * sbn, mask=(ks[:, None] < K) & (cols[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
    tl.store(c_ptr + rows[:, None] * scm + cols[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def plain(a, b, bm, bn, bk, w, s):
    m, kk = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    plain_gemm[(triton.cdiv(m, bm) * triton.cdiv(n, bn),)](a, b, c, m, n, kk, a.stride(0), a.stride(1), b.stride(0),
                                                           b.stride(1), c.stride(0), c.stride(1), BM=bm, BN=bn, BK=bk,
                                                           GROUP_M=8, num_warps=w, num_stages=s)
    return c


rows_big = 8192 if CUDA else 100
for name, kk, n in (("qkv", 4096, 14336), ("o_proj", 12288, 4096), ("shared_gate_up", 4096, 2816),
                    ("shared_down", 1408, 4096), ("lm_head", 4096, 151552)):
    if not CUDA:
        kk, n = kk // 32, n // 32
    wt = torch.randn(n, kk, device=DEV, dtype=DT) * 0.02
    for m in ((rows_big,) if name != "lm_head" else (1, 32)) + ((1, 8, 32) if name != "lm_head" else ()):
        x = torch.randn(m, kk, device=DEV, dtype=DT)
        row = {"shape": name, "m": m, "cublas_ms": timed(lambda: F.linear(x, wt))}
        one = plain(x[:1], wt.t(), 16, 32, 64, 4, 4)
        cfgs = ([(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4),
                 (128, 128, 64, 8, 4), (64, 256, 64, 4, 4), (256, 128, 64, 8, 3), (128, 256, 32, 8, 4)] if m > 256 else
                [(16, 16, 64, 4, 4), (16, 32, 64, 4, 4), (16, 64, 64, 4, 4), (16, 32, 128, 4, 4), (16, 16, 128, 4, 5),
                 (16, 64, 128, 4, 3), (32, 32, 64, 4, 4), (32, 64, 64, 4, 4)])
        for bm, bn, bk, w_, st in cfgs:
            key = f"{bm}x{bn}x{bk}w{w_}s{st}"
            try:
                c = plain(x, wt.t(), bm, bn, bk, w_, st)
                row[key + "_ms"] = timed(lambda: plain(x, wt.t(), bm, bn, bk, w_, st))
                row[key + "_row0_same"] = bool(torch.equal(c[0], one[0]))
            except Exception as e:  # noqa: BLE001
                row[key + "_error"] = str(e)[:200]
        res["dense"].append(row)
        print(row, flush=True)
    del wt
json.dump(res, open(f"{out_dir}/attn_tune.json", "w"), indent=1)

# (4) the MoE kernels (0220) on a prompt-sized step, at launch shapes for 0390's large steps
res["moe"] = []
from transformers._pb import fused_moe  # noqa: E402

E, I, HID, TOPK = (128, 1408, 4096, 8) if CUDA else (8, 64, 128, 2)
ntok = 8192 if CUDA else 100
w_gu = torch.randn(E, 2 * I, HID, device=DEV, dtype=DT) * 0.02
w_d = torch.randn(E, HID, I, device=DEV, dtype=DT) * 0.02
xs = torch.randn(ntok, HID, device=DEV, dtype=DT)
idx = torch.stack([torch.randperm(E, device=DEV)[:TOPK] for _ in range(ntok)]).to(torch.int64)
wts = torch.rand(ntok, TOPK, device=DEV, dtype=DT)
_, gate_up_k, down_k = fused_moe._get_kernels()


def moe(x, index, weights, block_m, gu, d):
    tokens = x.shape[0]
    rows, block_expert = fused_moe.align(index, E, block_m)
    n_pairs = tokens * TOPK
    blocks = block_expert.numel()
    h = torch.empty((n_pairs, I), dtype=x.dtype, device=x.device)
    y = torch.zeros((n_pairs, HID), dtype=x.dtype, device=x.device)
    gate_up_k[(blocks, triton.cdiv(I, gu[0]))](x, w_gu, h, rows, block_expert, n_pairs, TOPK, HID, I, x.stride(0),
                                               w_gu.stride(0), w_gu.stride(1), h.stride(0), BM=block_m, BN=gu[0],
                                               BK=gu[1], EVEN_K=HID % gu[1] == 0, num_warps=gu[2], num_stages=gu[3])
    down_k[(blocks, triton.cdiv(HID, d[0]))](h, w_d, y, rows, block_expert, weights.reshape(-1), n_pairs, HID, I,
                                             h.stride(0), w_d.stride(0), w_d.stride(1), y.stride(0), BM=block_m,
                                             BN=d[0], BK=d[1], EVEN_K=I % d[1] == 0, num_warps=d[2], num_stages=d[3])
    return y


decode = moe(xs[:16], idx[:16], wts[:16], 16, (32, 128, 4, 4), (32, 128, 4, 4))
for block_m, gu, d in [(64, (64, 128, 8, 3), (128, 128, 8, 3)), (64, (128, 128, 8, 2), (128, 128, 8, 3)),
                       (128, (64, 128, 8, 3), (128, 128, 8, 3)), (128, (128, 128, 8, 2), (256, 128, 8, 2)),
                       (128, (64, 128, 4, 3), (128, 128, 4, 3)), (64, (128, 64, 8, 3), (128, 64, 8, 4)),
                       (128, (128, 64, 8, 3), (128, 64, 8, 4)), (128, (64, 64, 4, 4), (128, 64, 4, 4)),
                       (64, (64, 64, 4, 4), (128, 64, 4, 4)), (128, (128, 128, 8, 3), (128, 128, 8, 3))]:
    key = f"bm{block_m}-gu{'x'.join(map(str, gu))}-d{'x'.join(map(str, d))}"
    try:
        y = moe(xs, idx, wts, block_m, gu, d)
        ms = timed(lambda: moe(xs, idx, wts, block_m, gu, d), reps=5)
        res["moe"].append({"cfg": key, "ms": ms, "first16_same_as_decode": bool(torch.equal(y[:16 * TOPK], decode))})
    except Exception as e:  # noqa: BLE001
        res["moe"].append({"cfg": key, "error": str(e)[:300]})
    print(res["moe"][-1], flush=True)
json.dump(res, open(f"{out_dir}/attn_tune.json", "w"), indent=1)

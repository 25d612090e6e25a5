"""On an H200, timed in CUDA graphs with the weights rotated past L2: (a) 0380's dense products at
decode and prompt row counts, the weight's K in chunks (today's rule) against one chunk; (b) the
router's logits from bfloat16 operands into float32, in 16 chunks; (c) 0220's MoE kernels with the
programs ordered expert block by expert block. Writes OUT/tune2.json."""
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

sys.path.insert(0, ".jobs")
import igk  # noqa: E402  (the dev tree's invariant_gemm_kernel.py, with CHUNKED)

out_dir = sys.argv[1]
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
DT = torch.bfloat16 if CUDA else torch.float16
res = {"dense": [], "router": [], "moe": []}


def copies_for(nbytes):
    return max(1, min(64, -(-(96 << 20) // max(nbytes, 1))))


def gtimed(make, reps=20):
    """make(i) runs call i (i picks the weight copy); median-free: mean over reps in a CUDA graph."""
    if not CUDA:
        make(0)
        return 0.0
    make(0)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            make(i)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            make(i)
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5):
        g.replay()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / (5 * reps) * 1000  # us


def timed(fn, reps=10):
    if not CUDA:
        fn()
        return 0.0
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps * 1000  # us


def old_chunk_k(n, k):
    tiles_n = -(-n // 128)
    blocks = max(1, -(-k // 64))
    chunks = min(blocks, 16, max(1, -(-256 // tiles_n)))
    return -(-blocks // chunks) * 64


def run(a, b, out_dtype, step, tile, chunk_programs):
    """tile (bm, bn, bk, warps, stages)."""
    (m, k), n = a.shape, b.shape[1]
    bm, bn, bk, w, st = tile
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    chunks = -(-k // step)
    tm, tn = -(-m // bm), -(-n // bn)
    if chunk_programs and chunks > 1:
        parts = torch.empty((chunks, m, n), dtype=torch.float32, device=a.device)
        igk.pb_gemm_chunks[(tm, tn, chunks)](a, b, parts, m, n, k, step, a.stride(0), a.stride(1), b.stride(0),
                                             b.stride(1), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PRECISION="ieee",
                                             num_warps=w, num_stages=st)
        igk.pb_gemm_sum[(-(-m // min(bm, 32)), tn)](parts, out, out, m, n, chunks, out.stride(0), out.stride(1),
                                                    HAS_BIAS=False, BLOCK_M=min(bm, 32), BLOCK_N=bn, num_warps=4)
    else:
        igk.pb_gemm[(tm * tn,)](a, b, out, out, m, n, k, step, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                                out.stride(0), out.stride(1), HAS_BIAS=False, CHUNKED=chunks > 1, BLOCK_M=bm,
                                BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, PRECISION="ieee", num_warps=w, num_stages=st)
    return out


SHAPES = (("qkv", 4096, 14336), ("o_proj", 12288, 4096), ("shared_gate_up", 4096, 2816), ("shared_down", 1408, 4096),
          ("lm_head", 4096, 151552))
SMALL = [(16, 128, 64, 4, 4), (16, 16, 64, 4, 4), (16, 32, 64, 4, 4), (16, 64, 64, 4, 4), (16, 32, 128, 4, 4),
         (16, 16, 128, 4, 4), (16, 64, 128, 4, 3), (32, 32, 64, 4, 4), (32, 64, 64, 4, 4), (32, 128, 64, 4, 4)]
LARGE = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 4)]
for name, k, n in SHAPES:
    if not CUDA:
        k, n = k // 32, n // 32
    ws = [(torch.randn(n, k, device=DEV, dtype=DT) * 0.02) for _ in range(copies_for(n * k * 2))]
    for m in ((1, 8, 32, 8192) if name != "lm_head" else (1, 32)):
        if not CUDA and m == 8192:
            m = 300
        x = torch.randn(m, k, device=DEV, dtype=DT)
        row = {"shape": name, "m": m, "old_chunks": -(-k // old_chunk_k(n, k))}
        big = m > 256
        t = timed if big else gtimed
        row["cublas_us"] = (timed(lambda: F.linear(x, ws[0])) if big else gtimed(lambda i: F.linear(x, ws[i % len(ws)])))
        for rule, step in (("old", old_chunk_k(n, k)), ("one", k)):
            alone = run(x[:1], ws[0].t(), DT, step, (16, 32, 64, 4, 4), True)
            for tile in (LARGE if big else SMALL):
                key = f"{rule}-{'x'.join(map(str, tile))}"
                try:
                    c = run(x, ws[0].t(), DT, step, tile, not big)
                    row[key + "_same"] = bool(torch.equal(c[0], alone[0]))
                    row[key + "_us"] = (timed(lambda: run(x, ws[0].t(), DT, step, tile, False)) if big else
                                        gtimed(lambda i: run(x, ws[i % len(ws)].t(), DT, step, tile, True)))
                except Exception as e:  # noqa: BLE001
                    row[key + "_error"] = str(e)[:200]
        res["dense"].append(row)
        print(json.dumps(row), flush=True)
    del ws
json.dump(res, open(f"{out_dir}/tune2.json", "w"), indent=1)

# (b) the router: bf16 operands, float32 logits, 16 chunks of 256
kr = 4096 if CUDA else 256
ws = [(torch.randn(128, kr, device=DEV, dtype=DT) * 0.02) for _ in range(64 if CUDA else 2)]
for m in ((1, 8, 64, 512, 8192) if CUDA else (1, 70)):
    x = torch.randn(m, kr, device=DEV, dtype=DT)
    big = m > 256
    exact = F.linear(x.double(), ws[0].double())
    row = {"m": m}
    row["cublas_fp32_with_casts_us"] = (timed(lambda: F.linear(x.float(), ws[0].float())) if big else
                                        gtimed(lambda i: F.linear(x.float(), ws[i % len(ws)].float())))
    row["cublas_err"] = float((F.linear(x.float(), ws[0].float()).double() - exact).abs().max())
    alone = run(x[:1], ws[0].t(), torch.float32, 256, (16, 32, 64, 4, 4), True)
    for tile, progs in (((16, 32, 64, 4, 4), True), ((16, 64, 64, 4, 4), True), ((16, 128, 64, 4, 4), True),
                        ((16, 32, 128, 4, 4), True), ((64, 128, 64, 4, 4), False), ((128, 128, 64, 8, 3), False),
                        ((64, 64, 64, 4, 4), False), ((16, 128, 64, 4, 4), False)):
        key = f"{'x'.join(map(str, tile))}{'-programs' if progs else '-one'}"
        try:
            c = run(x, ws[0].t(), torch.float32, 256, tile, progs)
            row[key + "_same"] = bool(torch.equal(c[0], alone[0]))
            row[key + "_err"] = float((c.double() - exact).abs().max())
            row[key + "_us"] = (timed(lambda: run(x, ws[0].t(), torch.float32, 256, tile, progs)) if big else
                                gtimed(lambda i: run(x, ws[i % len(ws)].t(), torch.float32, 256, tile, progs)))
        except Exception as e:  # noqa: BLE001
            row[key + "_error"] = str(e)[:200]
    res["router"].append(row)
    print(json.dumps(row), flush=True)
json.dump(res, open(f"{out_dir}/tune2.json", "w"), indent=1)


# (c) MoE kernels with the programs in expert-block order (GROUP blocks at a time, all column tiles)
@triton.jit
def order(BLOCKS, N_TILES, GROUP: tl.constexpr):
    pid = tl.program_id(0)
    per_group = GROUP * N_TILES
    first = (pid // per_group) * GROUP
    size = tl.minimum(BLOCKS - first, GROUP)
    return first + (pid % per_group) % size, (pid % per_group) // size


@triton.jit
def gate_up_g(x_ptr, w_ptr, h_ptr, rows_ptr, block_expert_ptr, n_pairs, top_k, hidden, inter, BLOCKS,
              stride_x, stride_we, stride_wn, stride_h, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
              GROUP: tl.constexpr):
    pid_m, pid_n = order(BLOCKS, tl.cdiv(inter, BN), GROUP)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pairs = tl.load(rows_ptr + pid_m * BM + tl.arange(0, BM))
    valid = pairs < n_pairs
    tokens = tl.where(valid, pairs // top_k, 0)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < inter
    offs_n = tl.where(n_ok, offs_n, 0)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    x_rows = x_ptr + tokens[:, None].to(tl.int64) * stride_x
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, hidden, BK):
        offs_k = k0 + tl.arange(0, BK)
        x = tl.load(x_rows + offs_k[None, :], mask=valid[:, None], other=0.0)
        wg = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None])
        wu = tl.load(w_base + (offs_n[None, :] + inter) * stride_wn + offs_k[:, None])
        acc_g += tl.dot(x, wg)
        acc_u += tl.dot(x, wu)
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    tl.store(h_ptr + pairs[:, None].to(tl.int64) * stride_h + offs_n[None, :], h.to(h_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


@triton.jit
def down_g(h_ptr, w_ptr, y_ptr, rows_ptr, block_expert_ptr, weights_ptr, n_pairs, hidden, inter, BLOCKS,
           stride_h, stride_we, stride_wn, stride_y, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
           GROUP: tl.constexpr):
    pid_m, pid_n = order(BLOCKS, tl.cdiv(hidden, BN), GROUP)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    pairs = tl.load(rows_ptr + pid_m * BM + tl.arange(0, BM))
    valid = pairs < n_pairs
    safe = tl.where(valid, pairs, 0)
    offs_n = pid_n * BN + tl.arange(0, BN)
    n_ok = offs_n < hidden
    offs_n = tl.where(n_ok, offs_n, 0)
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    h_rows = h_ptr + safe[:, None].to(tl.int64) * stride_h
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, inter, BK):
        offs_k = k0 + tl.arange(0, BK)
        h = tl.load(h_rows + offs_k[None, :], mask=valid[:, None], other=0.0)
        w = tl.load(w_base + offs_n[None, :] * stride_wn + offs_k[:, None])
        acc += tl.dot(h, w)
    weight = tl.load(weights_ptr + safe, mask=valid, other=0.0).to(tl.float32)
    acc = acc * weight[:, None]
    tl.store(y_ptr + pairs[:, None].to(tl.int64) * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=valid[:, None] & n_ok[None, :])


sys.path.insert(0, "src")
from transformers._pb import fused_moe  # noqa: E402

E, I, HID, TOPK = (128, 1408, 4096, 8) if CUDA else (8, 64, 128, 2)
ntok = 8192 if CUDA else 100
w_gu = torch.randn(E, 2 * I, HID, device=DEV, dtype=DT) * 0.02
w_d = torch.randn(E, HID, I, device=DEV, dtype=DT) * 0.02
xs = torch.randn(ntok, HID, device=DEV, dtype=DT)
idx = torch.stack([torch.randperm(E, device=DEV)[:TOPK] for _ in range(ntok)]).to(torch.int64)
wts = torch.rand(ntok, TOPK, device=DEV, dtype=DT)
_, gate_up_k, down_k = fused_moe._get_kernels()


def moe(x, index, weights, block_m, gu, d, group, aligned=None):
    tokens = x.shape[0]
    rows, block_expert = aligned if aligned is not None else fused_moe.align(index, E, block_m)
    n_pairs = tokens * TOPK
    blocks = block_expert.numel()
    h = torch.empty((n_pairs, I), dtype=x.dtype, device=x.device)
    y = torch.zeros((n_pairs, HID), dtype=x.dtype, device=x.device)
    if group is None:
        gate_up_k[(blocks, triton.cdiv(I, gu[0]))](x, w_gu, h, rows, block_expert, n_pairs, TOPK, HID, I, x.stride(0),
                                                   w_gu.stride(0), w_gu.stride(1), h.stride(0), BM=block_m, BN=gu[0],
                                                   BK=gu[1], EVEN_K=True, num_warps=gu[2], num_stages=gu[3])
        down_k[(blocks, triton.cdiv(HID, d[0]))](h, w_d, y, rows, block_expert, weights.reshape(-1), n_pairs, HID, I,
                                                 h.stride(0), w_d.stride(0), w_d.stride(1), y.stride(0), BM=block_m,
                                                 BN=d[0], BK=d[1], EVEN_K=True, num_warps=d[2], num_stages=d[3])
    else:
        gate_up_g[(blocks * triton.cdiv(I, gu[0]),)](x, w_gu, h, rows, block_expert, n_pairs, TOPK, HID, I, blocks,
                                                     x.stride(0), w_gu.stride(0), w_gu.stride(1), h.stride(0),
                                                     BM=block_m, BN=gu[0], BK=gu[1], GROUP=group, num_warps=gu[2],
                                                     num_stages=gu[3])
        down_g[(blocks * triton.cdiv(HID, d[0]),)](h, w_d, y, rows, block_expert, weights.reshape(-1), n_pairs, HID,
                                                   I, blocks, h.stride(0), w_d.stride(0), w_d.stride(1), y.stride(0),
                                                   BM=block_m, BN=d[0], BK=d[1], GROUP=group, num_warps=d[2],
                                                   num_stages=d[3])
    return y


decode = moe(xs[:16], idx[:16], wts[:16], 16, (32, 128, 4, 4), (32, 128, 4, 4), None)
al = {bm: fused_moe.align(idx, E, bm) for bm in (64, 128)}
res["moe_align_us"] = {bm: timed(lambda: fused_moe.align(idx, E, bm)) for bm in (64, 128)}
for block_m, gu, d, group in [(128, (128, 64, 8, 3), (128, 64, 8, 4), None), (128, (128, 64, 8, 3), (128, 64, 8, 4), 1),
                              (128, (128, 64, 8, 3), (128, 64, 8, 4), 4), (128, (128, 64, 8, 3), (128, 64, 8, 4), 8),
                              (128, (64, 64, 8, 4), (128, 64, 8, 4), 4), (128, (128, 64, 8, 4), (256, 64, 8, 3), 4),
                              (64, (128, 64, 4, 4), (128, 64, 4, 4), 4), (128, (64, 128, 8, 3), (128, 128, 8, 3), 4),
                              (128, (128, 64, 8, 3), (128, 64, 8, 4), 16), (64, (128, 64, 8, 3), (128, 64, 8, 4), 8)]:
    key = f"bm{block_m}-gu{'x'.join(map(str, gu))}-d{'x'.join(map(str, d))}-g{group}"
    try:
        y = moe(xs, idx, wts, block_m, gu, d, group, al[block_m])
        us = timed(lambda: moe(xs, idx, wts, block_m, gu, d, group, al[block_m]), reps=5)
        res["moe"].append({"cfg": key, "us_without_align": us, "first16_same_as_decode": bool(torch.equal(y[:16 * TOPK], decode))})
    except Exception as e:  # noqa: BLE001
        res["moe"].append({"cfg": key, "error": str(e)[:300]})
    print(res["moe"][-1], flush=True)
# decode-sized steps in graphs: today's launch against the expert-block order
for tokens in (1, 8, 32):
    al16 = fused_moe.align(idx[:tokens], E, 16)
    row = {"decode_tokens": tokens}
    for group in (None, 1, 4):
        row[f"g{group}_us"] = gtimed(lambda i: moe(xs[:tokens], idx[:tokens], wts[:tokens], 16, (32, 128, 4, 4),
                                                   (32, 128, 4, 4), group, al16))
    res["moe"].append(row)
    print(row, flush=True)
json.dump(res, open(f"{out_dir}/tune2.json", "w"), indent=1)

"""(tune3) On an H200: 0220's MoE down kernel alone on an 8K-token step at TP=1 and TP=2 widths
(1408 and 704), at launch shapes and program orders, against the 16-row decode launch's bits.
Writes OUT/tune3.json."""
import json
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


out_dir = sys.argv[1]
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
DT = torch.bfloat16 if CUDA else torch.float16
res = {}


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



res["down"] = []
for inter in ((1408, 704) if CUDA else (64,)):
    wd = torch.randn(E, HID, inter, device=DEV, dtype=DT) * 0.02
    al = {bm: fused_moe.align(idx, E, bm) for bm in (64, 128)}
    n_pairs = ntok * TOPK
    h = torch.randn(n_pairs, inter, device=DEV, dtype=DT)
    flat_w = wts.reshape(-1)

    def down(block_m, d, group):
        rows, block_expert = al[block_m] if block_m in al else fused_moe.align(idx, E, block_m)
        blocks = block_expert.numel()
        y = torch.empty((n_pairs, HID), dtype=DT, device=DEV)
        if group is None:
            down_k[(blocks, triton.cdiv(HID, d[0]))](h, wd, y, rows, block_expert, flat_w, n_pairs, HID, inter,
                                                     h.stride(0), wd.stride(0), wd.stride(1), y.stride(0), BM=block_m,
                                                     BN=d[0], BK=d[1], EVEN_K=inter % d[1] == 0, num_warps=d[2],
                                                     num_stages=d[3])
        else:
            down_g[(blocks * triton.cdiv(HID, d[0]),)](h, wd, y, rows, block_expert, flat_w, n_pairs, HID, inter,
                                                       blocks, h.stride(0), wd.stride(0), wd.stride(1), y.stride(0),
                                                       BM=block_m, BN=d[0], BK=d[1], GROUP=group, num_warps=d[2],
                                                       num_stages=d[3])
        return y

    ref = down(16, (32, 128, 4, 4), None)
    for block_m, d, group in [(128, (128, 64, 8, 4), None), (64, (128, 128, 8, 3), None), (128, (128, 128, 8, 3), None),
                              (128, (256, 64, 8, 3), None), (128, (128, 64, 4, 4), None), (64, (128, 64, 4, 4), None),
                              (64, (256, 64, 8, 3), None), (128, (128, 64, 8, 4), 1), (128, (128, 64, 8, 4), 8),
                              (128, (256, 64, 8, 3), 1), (64, (128, 64, 4, 4), 1), (64, (256, 64, 4, 3), 1),
                              (128, (128, 128, 8, 2), None), (128, (64, 64, 4, 4), None), (64, (64, 128, 4, 3), None),
                              (128, (256, 128, 8, 2), None), (64, (128, 64, 4, 5), None), (32, (128, 64, 4, 4), None)]:
        key = f"I{inter}-bm{block_m}-d{'x'.join(map(str, d))}-g{group}"
        try:
            y = down(block_m, d, group)
            us = timed(lambda: down(block_m, d, group), reps=10)
            res["down"].append({"cfg": key, "us": us, "same_as_16row_launch": bool(torch.equal(y, ref))})
        except Exception as e:  # noqa: BLE001
            res["down"].append({"cfg": key, "error": str(e)[:300]})
        print(res["down"][-1], flush=True)
    del wd, h
json.dump(res, open(f"{out_dir}/tune3.json", "w"), indent=1)

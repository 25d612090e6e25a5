"""0840 on the GPU: one layer's attention read from a paged cache, bf16 rows against 0830's e4m3
rows and 0840's int8 rows, in one process (production's kernels: 0400 TMA prompt blocks, 0740
decode parts, 0750 reading the pages), each timed as CUDA-graph replays; and the write of a step's
keys and values (index_copy against kv_fp8.write_both). W58's kvbench.py with a third arm. Prints
one JSON line a case."""
import json, sys, time
import torch
from transformers._pb.ops import kv_fp8, varlen_attention

HEADS, KV, DIM, PAGE = 96, 8, 128, 256
torch.manual_seed(0)


def timed(fn, reps=50):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    best = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record(); torch.cuda.synchronize()
        best.append(a.elapsed_time(b) / reps * 1000)
    return min(best)


def case(name, seqs):
    cu_q, cu_k = [0], [0]
    for past, new in seqs:
        cu_q.append(cu_q[-1] + new); cu_k.append(cu_k[-1] + past + new)
    pages = [-(-(p + n) // PAGE) for p, n in seqs]
    total = (sum(pages) + 3) * PAGE
    rows = torch.randperm(sum(pages) + 3, device="cuda")[: sum(pages)] * PAGE
    index, taken = [], 0
    for (p, n), c in zip(seqs, pages):
        st = rows[taken:taken + c]; taken += c
        index.append((st[:, None] + torch.arange(PAGE, device="cuda")[None]).flatten()[: p + n])
    index = torch.cat(index)
    q = torch.randn((1, cu_q[-1], HEADS, DIM), device="cuda").bfloat16().transpose(1, 2)
    k = torch.randn((cu_k[-1], KV, DIM), device="cuda").bfloat16()
    v = torch.randn((cu_k[-1], KV, DIM), device="cuda").bfloat16()
    cq = torch.tensor(cu_q, dtype=torch.int32, device="cuda"); ck = torch.tensor(cu_k, dtype=torch.int32, device="cuda")
    bk = torch.zeros((total, KV, DIM), dtype=torch.bfloat16, device="cuda"); bv = torch.zeros_like(bk)
    bk[index], bv[index] = k, v
    pb = [c.transpose(0, 1).unsqueeze(0) for c in (bk, bv)]
    varlen_attention.ENABLED = varlen_attention.FAST = varlen_attention.SPLIT = varlen_attention.READ_CACHE = True
    t_b = timed(lambda: varlen_attention._attend(q, *pb, DIM ** -0.5, cq, ck, index, fast=True))
    new = cu_q[-1]
    widx = index[-new:] if new else index[:1]
    nk = torch.randn((widx.numel(), KV, DIM), device="cuda").bfloat16()
    out = {"case": name, "bf16_us": round(t_b, 1),
           "write_bf16_us": round(timed(lambda: (bk.index_copy_(0, widx, nk), bv.index_copy_(0, widx, nk))), 1)}
    for fmt in ("e4m3", "int8"):
        kv_fp8.FORMAT = fmt
        caches = []
        for _ in (k, v):
            raw = torch.zeros(total * kv_fp8.row_bytes(KV, DIM), dtype=torch.uint8, device="cuda")
            caches.append(kv_fp8.views(raw, total, KV, DIM))
        kv_fp8.write_both(tuple(d for d, _ in caches), tuple(s for _, s in caches), index, k, v)
        pf = [d.view(kv_fp8.element()).transpose(0, 1).unsqueeze(0) for d, _ in caches]
        sc = tuple(s for _, s in caches)
        t_f = timed(lambda: varlen_attention._attend(q, *pf, DIM ** -0.5, cq, ck, index, fast=True, scales=sc))
        out[f"{fmt}_us"] = round(t_f, 1)
        out[f"bf16/{fmt}"] = round(t_b / t_f, 3)
        out[f"write_{fmt}_us"] = round(timed(lambda: kv_fp8.write_both(tuple(d for d, _ in caches),
                                                                        tuple(s for _, s in caches), widx, nk, nk)), 1)
        del caches, pf
    kv_fp8.restore()
    print(json.dumps(out), flush=True)


for name, seqs in [("C1 decode 8K", [(8191, 1)]), ("C1 decode 32K", [(32767, 1)]), ("C1 decode 128K", [(131071, 1)]),
                   ("C16 decode 8K", [(8191, 1)] * 16), ("C64 decode 2K", [(2047, 1)] * 64),
                   ("C128 decode 1K", [(1023, 1)] * 128),
                   ("4K chunk after 28K", [(28672, 4096)]), ("385-row turn after 32K", [(32400, 385)]),
                   ("2K chunk after 6K + 32 decode 8K", [(6144, 2048)] + [(8191, 1)] * 32)]:
    case(name, seqs)

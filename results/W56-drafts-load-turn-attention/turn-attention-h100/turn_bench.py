"""One-off: air12's prompt attention for a conversation turn's new rows over a long cached prefix
(96 query heads over 8 KV heads, dim 128, bf16, keys read through the cache's pages), as CUDA
graph replays: achieved TFLOP/s, to tell whether splitting the keys across programs could pay."""
import json, sys
import torch
from transformers._pb.ops import varlen_attention as va
H, KV, D = 96, 8, 128
va.ENABLED, va.FAST, va.SPLIT = True, True, True
def timed(fn, reps=20):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(reps):
            g.replay()
        b.record(); torch.cuda.synchronize()
        best = min(best, a.elapsed_time(b) / reps * 1000)
    return best
rows = []
for ctx, new in ((32768, 385), (32768, 128), (32768, 512), (8192, 385), (65536, 385), (392, 392)):
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn((1, new, H, D), generator=gen, device="cuda").bfloat16().transpose(1, 2)
    pages = -(-ctx // 256)
    ck = torch.randn((pages + 4) * 256, KV, D, generator=gen, device="cuda").bfloat16()
    cv = torch.randn((pages + 4) * 256, KV, D, generator=gen, device="cuda").bfloat16()
    order = torch.randperm(pages + 4, device="cuda", generator=gen)[:pages]
    index = (order[:, None] * 256 + torch.arange(256, device="cuda")[None]).flatten()[:ctx].contiguous()
    cu_q = torch.tensor([0, new], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, ctx], dtype=torch.int32, device="cuda")
    paged = [c.transpose(0, 1).unsqueeze(0) for c in (ck, cv)]
    fn = lambda: va._attend(q, *paged, D ** -0.5, cu_q, cu_k, index, fast=True)
    us = timed(fn)
    flops = 4 * H * D * sum(ctx - new + i + 1 for i in range(new))
    padded = 4 * H * D * (-(-new // 128) * 128) * ctx
    r = {"ctx": ctx, "new": new, "us": round(us, 1), "tflops": round(flops / us / 1e6, 1),
         "tflops_padded": round(padded / us / 1e6, 1), "ms_12_layers": round(12 * us / 1000, 2)}
    base = fn().clone()
    for bm, warps in ((64, 4), (64, 8)):  # smaller prompt blocks: less padding; same bits per row?
        va.BLOCK_M, va.WARPS = bm, warps
        try:
            other = fn().clone()
            r[f"m{bm}w{warps}_us"] = round(timed(fn), 1)
            r[f"m{bm}w{warps}_same_bits"] = bool(torch.equal(other, base))
            r[f"m{bm}w{warps}_max_diff"] = (other.float() - base.float()).abs().max().item()
        except Exception as e:
            r[f"m{bm}w{warps}_error"] = repr(e)[:200]
        va.BLOCK_M, va.WARPS = 128, 8
    rows.append(r); print(json.dumps(r), flush=True)
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))

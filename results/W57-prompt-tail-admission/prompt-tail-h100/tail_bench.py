"""One-off (0830): air12's prompt attention (96 query heads over 8 KV heads, dim 128, bf16, keys read
through shuffled pages of 256, 0400 + 0750) for a sequence's new rows over its cached keys, as CUDA
graph replays, with the last block in 128 rows (0370) and in smaller tails; the same bits?"""
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
VARIANTS = (("t16_64", True, 64, 16), ("t32_64", True, 64, 32), ("t64", True, 64, 0), ("t16", True, 0, 16))
rows = []
for ctx, new in ((32768, 385), (32768, 320), (32768, 257), (32768, 9), (32768, 40), (8192, 385), (65536, 385),
                 (131072, 385), (392, 392), (8192, 8192), (40, 40)):
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
    va.TAIL = False
    us = timed(fn)
    flops = 4 * H * D * sum(ctx - new + i + 1 for i in range(new))
    r = {"ctx": ctx, "new": new, "us": round(us, 1), "tflops_needed": round(flops / us / 1e6, 1),
         "ms_12_layers": round(12 * us / 1000, 3)}
    base = fn().clone()
    for name, tail, rows_, small in VARIANTS:
        va.TAIL, va.TAIL_ROWS, va.SMALL_TAIL_ROWS = tail, rows_, small
        try:
            other = fn().clone()
            t = timed(fn)
            r[name] = {"us": round(t, 1), "x": round(us / t, 3), "same_bits": bool(torch.equal(other, base)),
                       "max_diff": (other.float() - base.float()).abs().max().item()}
        except Exception as e:
            r[name] = {"error": repr(e)[:300]}
        va.TAIL, va.TAIL_ROWS, va.SMALL_TAIL_ROWS = False, 64, 16
    rows.append(r); print(json.dumps(r), flush=True)
    del q, ck, cv, paged; torch.cuda.empty_cache()
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))

"""One-off: 0370/0400's prompt kernel (air12's heads, keys through shuffled pages, 0750) at other
launch settings (warps, pipeline stages): same bits as production's (8 warps, Triton's default
stages), and time, for a 32K conversation turn and cold prompts. python3 stages_bench.py OUT"""
import json, sys
import torch
from transformers._pb.ops import stable_launch, varlen_attention as va
from transformers._pb.ops.common import kernels, pow2
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
def prompt(q, key, value, cu_q, cu_k, index, warps, stages, block_n=va.BLOCK_N):
    """_attend's prompt-kernel launch (its decode launch left out: these steps hold no decode row)."""
    kernel = kernels("varlen_attention")
    sequences = cu_q.numel() - 1
    _, heads, tokens, dim = query_shape = q.shape
    out = torch.zeros((1, tokens, heads, dim), dtype=q.dtype, device=q.device)
    strides = (q.stride(2), q.stride(1), key.stride(2), key.stride(1), value.stride(2), value.stride(1),
               out.stride(1), out.stride(2))
    lengths = cu_q[1:] - cu_q[:-1]
    blocks = torch.where(lengths > 1, (lengths + va.BLOCK_M - 1) // va.BLOCK_M, 0)
    block_end = torch.cumsum(blocks, 0).to(torch.int32)
    views = [t[0].transpose(0, 1) for t in (key, value)]
    from transformers._pb.ops import tma
    desc = [tma.descriptor(t, [block_n, 1, t.shape[-1]]) for t in views]
    extra = {} if stages is None else {"num_stages": stages}
    kernel.pb_varlen_attention[(heads, -(-tokens // va.BLOCK_M) + sequences)](
        q, key, value, out, *desc, index, cu_q, cu_k, block_end, sequences, dim ** -0.5, *strides,
        GROUPS=heads // key.shape[1], HEAD_DIM=dim, BLOCK_M=va.BLOCK_M, BLOCK_N=block_n, SEQ_P2=16, FAST=True,
        INDEXED=True, num_warps=warps, **extra)
    return out
rows = []
SETTINGS = [(8, None), (8, 2), (8, 3), (8, 4), (4, None), (4, 2), (4, 3)]
for ctx, new in ((32768, 385), (32768, 128), (8192, 8192), (16384, 16384), (392, 392)):
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
    prod = lambda: va._attend(q, *paged, D ** -0.5, cu_q, cu_k, index, fast=True)
    base = prod().clone()
    us = timed(prod)
    flops = 4 * H * D * sum(ctx - new + i + 1 for i in range(new))
    r = {"ctx": ctx, "new": new, "prod_us": round(us, 1), "prod_tflops": round(flops / us / 1e6, 1)}
    for warps, stages in SETTINGS:
        name = f"w{warps}s{stages or 'd'}"
        try:
            fn = lambda: prompt(q, *paged, cu_q, cu_k, index, warps, stages)
            other = fn().clone()
            t = timed(fn)
            r[name] = {"us": round(t, 1), "x": round(us / t, 3), "same_bits": bool(torch.equal(other, base))}
        except Exception as e:
            r[name] = {"error": repr(e)[:200]}
    rows.append(r); print(json.dumps(r), flush=True)
    del q, ck, cv, paged; torch.cuda.empty_cache()
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))

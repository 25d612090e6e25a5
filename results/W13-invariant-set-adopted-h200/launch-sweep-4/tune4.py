"""(tune4) On an H200, after 0220's 16-byte stores: (1) the MoE gate/up and down kernels on an 8K-token
step at TP=1 and TP=2 widths, launch shapes incl. 256-row blocks, bits against the 16-row decode launch;
(2) 0380's pb_gemm at 8,192 rows on air12's dense weights (TP=1 and TP=2 shards) at wide tiles, bits
against the engine's current tile, time against cuBLAS (F.linear). Writes OUT/tune4.json."""
import json
import sys

import torch
import torch.nn.functional as F
import triton

out_dir = sys.argv[1]
DEV, DT = "cuda", torch.bfloat16
res = {"moe": [], "dense": []}
from transformers._pb import fused_moe, invariant_gemm  # noqa: E402
from transformers._pb.invariant_gemm_kernel import pb_gemm  # noqa: E402


def timed(fn, reps=10):
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


_, gate_up_k, down_k = fused_moe._get_kernels()
E, HID, TOPK, ntok = 128, 4096, 8, 8192
torch.manual_seed(0)
xs = torch.randn(ntok, HID, device=DEV, dtype=DT)
idx = torch.stack([torch.randperm(E, device=DEV)[:TOPK] for _ in range(ntok)]).to(torch.int64)
wts = torch.rand(ntok, TOPK, device=DEV, dtype=DT).reshape(-1)
n_pairs = ntok * TOPK
for inter in (1408, 704):
    w_gu = torch.randn(E, 2 * inter, HID, device=DEV, dtype=DT) * 0.02
    w_d = torch.randn(E, HID, inter, device=DEV, dtype=DT) * 0.02
    al = {}

    def gu(bm, t):
        rows, be = al.setdefault(bm, fused_moe.align(idx, E, bm))
        h = torch.empty((n_pairs, inter), dtype=DT, device=DEV)
        gate_up_k[(be.numel(), triton.cdiv(inter, t[0]))](xs, w_gu, h, rows, be, n_pairs, TOPK, HID, inter, xs.stride(0),
                                                         w_gu.stride(0), w_gu.stride(1), h.stride(0), BM=bm, BN=t[0],
                                                         BK=t[1], EVEN_K=HID % t[1] == 0, num_warps=t[2], num_stages=t[3])
        return h

    def dn(bm, t, h):
        rows, be = al.setdefault(bm, fused_moe.align(idx, E, bm))
        y = torch.empty((n_pairs, HID), dtype=DT, device=DEV)
        down_k[(be.numel(), triton.cdiv(HID, t[0]))](h, w_d, y, rows, be, wts, n_pairs, HID, inter, h.stride(0),
                                                     w_d.stride(0), w_d.stride(1), y.stride(0), BM=bm, BN=t[0], BK=t[1],
                                                     EVEN_K=inter % t[1] == 0, num_warps=t[2], num_stages=t[3])
        return y

    ref_h = gu(16, (32, 128, 4, 4))
    ref_y = dn(16, (32, 128, 4, 4), ref_h)
    for kind, bm, t in [("gate_up", 128, (128, 64, 8, 3)), ("gate_up", 128, (128, 64, 8, 4)), ("gate_up", 128, (128, 128, 8, 3)),
                        ("gate_up", 128, (64, 64, 4, 4)), ("gate_up", 128, (64, 128, 8, 3)), ("gate_up", 128, (128, 32, 8, 5)),
                        ("gate_up", 128, (256, 64, 8, 2)), ("gate_up", 256, (64, 64, 8, 3)), ("gate_up", 256, (64, 64, 8, 4)),
                        ("gate_up", 256, (128, 64, 8, 2)), ("gate_up", 64, (128, 64, 4, 4)), ("gate_up", 64, (256, 64, 8, 3)),
                        ("down", 128, (128, 64, 8, 4)), ("down", 128, (256, 64, 8, 3)), ("down", 128, (256, 64, 8, 4)),
                        ("down", 128, (256, 32, 8, 5)), ("down", 128, (256, 128, 8, 2)), ("down", 256, (128, 64, 8, 3)),
                        ("down", 256, (128, 64, 8, 4)), ("down", 256, (256, 64, 8, 2)), ("down", 64, (256, 64, 4, 3)),
                        ("down", 64, (256, 64, 8, 4))]:
        key = f"{kind}-I{inter}-bm{bm}-{'x'.join(map(str, t))}"
        try:
            if kind == "gate_up":
                out = gu(bm, t)
                us = timed(lambda: gu(bm, t))
                same = bool(torch.equal(out, ref_h))
            else:
                out = dn(bm, t, ref_h)
                us = timed(lambda: dn(bm, t, ref_h))
                same = bool(torch.equal(out, ref_y))
            res["moe"].append({"cfg": key, "us": round(us, 1), "same_as_16row_launch": same})
        except Exception as e:  # noqa: BLE001
            res["moe"].append({"cfg": key, "error": str(e)[:300]})
        print(res["moe"][-1], flush=True)
    del w_gu, w_d, ref_h, ref_y
    torch.cuda.empty_cache()
json.dump(res, open(f"{out_dir}/tune4.json", "w"), indent=1)

M = 8192
SHAPES = {"tp1": [("qkv+bias", 14336, 4096, True), ("o_proj", 4096, 12288, False), ("shared_gate_up", 2816, 4096, False),
                  ("shared_down", 4096, 1408, False), ("dense_gate_up", 21888, 4096, False), ("dense_down", 4096, 10944, False)],
          "tp2": [("qkv+bias", 7168, 4096, True), ("o_proj", 4096, 6144, False), ("shared_gate_up", 1408, 4096, False),
                  ("shared_down", 4096, 704, False), ("dense_gate_up", 10944, 4096, False), ("dense_down", 4096, 5472, False)]}
TILES = [(128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3),
         (128, 256, 32, 8, 5), (128, 128, 128, 8, 3), (128, 256, 64, 4, 3), (64, 256, 64, 4, 4)]
a = torch.randn(M, 12288, device=DEV, dtype=DT)
for tp, shapes in SHAPES.items():
    for name, n, k, has_bias in shapes:
        w = torch.randn(n, k, device=DEV, dtype=DT) * 0.02
        bias = torch.randn(n, device=DEV, dtype=DT) if has_bias else None
        x = a[:, :k].contiguous()
        b = w.t()
        step = invariant_gemm.chunk_k(n, k)
        chunks = -(-k // step)
        cur = invariant_gemm.tiles(M, DT, chunks > 1)

        def run(t):
            out = torch.empty((M, n), dtype=DT, device=DEV)
            pb_gemm[(-(-M // t[0]) * -(-n // t[1]),)](
                x, b, out if bias is None else bias, out, M, n, k, step, x.stride(0), x.stride(1), b.stride(0),
                b.stride(1), out.stride(0), out.stride(1), HAS_BIAS=bias is not None, CHUNKED=chunks > 1,
                BLOCK_M=t[0], BLOCK_N=t[1], BLOCK_K=t[2], GROUP_M=8, PRECISION="ieee", num_warps=t[3], num_stages=t[4])
            return out

        ref = run(tuple(cur))
        cublas = timed(lambda: F.linear(x, w, bias))
        row = {"tp": tp, "gemm": name, "n": n, "k": k, "chunks": chunks, "current": list(cur), "cublas_us": round(cublas, 1),
               "tiles": []}
        for t in TILES:
            try:
                o = run(t)
                row["tiles"].append({"tile": list(t), "us": round(timed(lambda: run(t)), 1), "same": bool(torch.equal(o, ref))})
            except Exception as e:  # noqa: BLE001
                row["tiles"].append({"tile": list(t), "error": str(e)[:200]})
        res["dense"].append(row)
        print(json.dumps(row), flush=True)
        del w, x
json.dump(res, open(f"{out_dir}/tune4.json", "w"), indent=1)

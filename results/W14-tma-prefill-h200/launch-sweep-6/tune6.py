"""0410 at 8,192 rows on an H200: every air12 TP=1 product through the engine's gemm with TMA off
and on (its own tile), other TMA tiles for each, and cuBLAS; bits against the pointer path.
python3 tune6.py OUT_DIR. Writes OUT_DIR/tune6.json."""
import json, sys
import torch, torch.nn.functional as F
from triton.testing import do_bench
from transformers._pb import invariant_gemm as ig

out_dir = sys.argv[1]
M = 8192
SHAPES = [("qkv+bias", 14336, 4096, True, torch.bfloat16), ("o_proj", 4096, 12288, False, torch.bfloat16),
          ("shared_gate_up", 2816, 4096, False, torch.bfloat16), ("shared_down", 4096, 1408, False, torch.bfloat16),
          ("dense_gate_up", 21888, 4096, False, torch.bfloat16), ("dense_down", 4096, 10944, False, torch.bfloat16),
          ("router_f32", 128, 4096, False, "router"), ("lm_head_8k", 151552, 4096, False, torch.bfloat16)]
TILES = [ig.Tiles(128, 128, 64, 8, 3), ig.Tiles(128, 128, 64, 8, 4), ig.Tiles(256, 128, 64, 8, 3),
         ig.Tiles(128, 256, 64, 8, 3), ig.Tiles(128, 64, 64, 4, 4), ig.Tiles(64, 128, 64, 4, 4), ig.Tiles(128, 128, 128, 8, 3)]
res = []
real_tiles = ig.tma_tiles
for name, n, k, has_bias, dt in SHAPES:
    gen = torch.Generator(device="cuda").manual_seed(n)
    dtype = torch.bfloat16
    w = (torch.randn((n, k), generator=gen, device="cuda") * 0.02).to(dtype)
    bias = (torch.randn((n,), generator=gen, device="cuda") * 0.02).to(dtype) if has_bias else None
    x = torch.randn((M if name != "lm_head_8k" else 1024, k), generator=gen, device="cuda").to(dtype)
    if dt == "router":
        f = lambda: ig.gemm(x, w.t(), out_dtype=torch.float32)
        cub = lambda: F.linear(x.float(), w.float())
    else:
        f = lambda: ig.gemm(x, w.t(), bias)
        cub = lambda: F.linear(x, w, bias)
    row = {"gemm": name, "n": n, "k": k, "rows": x.shape[0], "chunks": -(-k // ig.chunk_k(n, k))}
    ig.TMA = False
    ref = f(); row["pointer_ms"] = do_bench(f, warmup=5, rep=40)
    row["cublas_ms"] = do_bench(cub, warmup=5, rep=40)
    ig.TMA = True
    got = f(); row["tma_engine_ms"] = do_bench(f, warmup=5, rep=40); row["tma_engine_same_bits"] = bool(torch.equal(got, ref))
    row["tma_engine_tile"] = list(real_tiles(x.shape[0], n, row["chunks"] > 1) or [])
    row["tiles"] = []
    for t in TILES:
        ig.tma_tiles = lambda m, n_, chunked, t=t: t
        try:
            got = f()
            row["tiles"].append({"tile": list(t), "ms": do_bench(f, warmup=5, rep=40), "same_bits": bool(torch.equal(got, ref))})
        except Exception as e:  # noqa: BLE001
            row["tiles"].append({"tile": list(t), "error": str(e)[:200]})
        finally:
            ig.tma_tiles = real_tiles
    ig.TMA = False
    res.append(row)
    print(json.dumps(row), flush=True)
    json.dump(res, open(f"{out_dir}/tune6.json", "w"), indent=1)

import json, os, torch
from transformers._pb.ops import invariant_gemm
from patchbay.device.gpu_fp8 import fp8_scales
from patchbay.device.gpu_moe import _time
from patchbay.runtime import fp8
out = {}
for name, (n, k) in (("q_proj", (12288, 4096)), ("o_proj", (4096, 12288))):
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, grid = fp8.quantize((torch.randn((n, k), generator=gen, device="cuda") * 0.02).bfloat16())
    sc = fp8_scales(grid, n, fp8.BLOCK, "cuda")
    x = torch.randn((4096, k), generator=gen, device="cuda").bfloat16()
    alone = invariant_gemm.gemm_fp8(x[:1], q, *sc)
    base = invariant_gemm.fp8_tiles
    for label, tile in (("64x128w8", invariant_gemm.Tiles(128, 64, 0, 8, 3)), ("128x128w8", invariant_gemm.Tiles(128, 128, 0, 8, 3)),
                        ("128x128w4", invariant_gemm.Tiles(128, 128, 0, 4, 3)), ("128x256w8", invariant_gemm.Tiles(256, 128, 0, 8, 3)),
                        ("128x64w4", invariant_gemm.Tiles(64, 128, 0, 4, 4))):
        invariant_gemm.fp8_tiles = lambda m, t=tile: base(m) if m <= 256 else t
        try:
            got = invariant_gemm.gemm_fp8(x, q, *sc)
            us = _time(lambda: invariant_gemm.gemm_fp8(x, q, *sc), 10, graphs=True) * 1e6
            out[f"{name} {label}"] = {"same": bool(torch.equal(got[:1], alone)), "us": us}
        except Exception as e:
            out[f"{name} {label}"] = repr(e)[:200]
        invariant_gemm.fp8_tiles = base
    out[f"{name} bf16"] = _time(lambda: invariant_gemm.gemm(x, fp8.dequantize(q, grid, torch.bfloat16).t()), 10, graphs=True) * 1e6
print(json.dumps(out, indent=0))
json.dump(out, open(os.environ["OUT"] + "/bn_bits.json", "w"))

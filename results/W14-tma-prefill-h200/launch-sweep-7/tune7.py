"""0430 on an H200: air12's experts (TP=1: 128 experts, 8 a token, hidden 4096, inter 1408) on an
8,192-token step through 0390's large-step kernels, weights by pointer and through TMA, the
engine's tiles and others; bits against the pointer path. python3 tune7.py OUT_DIR."""
import json, sys
import torch
from triton.testing import do_bench
from transformers import Glm4MoeConfig
from transformers._pb import fused_moe, moe_one_path
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeExperts

out_dir = sys.argv[1]
res = {"rows": []}
for inter, label in ((1408, "tp1"), (704, "tp2")):
    config = Glm4MoeConfig(hidden_size=4096, moe_intermediate_size=inter, n_routed_experts=128, num_experts_per_tok=8)
    torch.manual_seed(0)
    experts = Glm4MoeExperts(config).cuda().bfloat16()
    with torch.no_grad():
        experts.gate_up_proj.normal_(0, 0.02)
        experts.down_proj.normal_(0, 0.02)
    x = torch.randn(8192, 4096, device="cuda").bfloat16()
    index = torch.rand(8192, 128, device="cuda").topk(8, dim=1).indices
    weights = torch.rand(8192, 8, device="cuda")
    f = lambda: fused_moe.experts_forward(experts, x, index, weights)
    moe_one_path.ENABLED = True
    saved = moe_one_path.GATE_UP_TILES, moe_one_path.DOWN_TILES
    with torch.no_grad():
        moe_one_path.TMA = False
        ref = f()
        row = {"shard": label, "pointer_ms": do_bench(f, warmup=5, rep=50)}
        moe_one_path.TMA = True
        got = f()
        row.update(tma_ms=do_bench(f, warmup=5, rep=50), tma_same_bits=bool(torch.equal(got, ref)), variants=[])
        for gu in [(128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (64, 64, 4, 4), (128, 32, 8, 4)]:
            for dn in [(256, 64, 8, 4), (128, 64, 8, 4), (256, 64, 8, 3), (128, 128, 8, 3)]:
                if gu != saved[0] and dn != saved[1]:
                    continue  # one kernel's tile at a time against the engine's other
                moe_one_path.GATE_UP_TILES, moe_one_path.DOWN_TILES = gu, dn
                for tma in (False, True):
                    moe_one_path.TMA = tma
                    try:
                        got = f()
                        row["variants"].append({"gate_up": gu, "down": dn, "tma": tma, "ms": do_bench(f, warmup=3, rep=30),
                                                "same_bits": bool(torch.equal(got, ref))})
                    except Exception as e:  # noqa: BLE001
                        row["variants"].append({"gate_up": gu, "down": dn, "tma": tma, "error": str(e)[:200]})
                moe_one_path.GATE_UP_TILES, moe_one_path.DOWN_TILES = saved
    moe_one_path.restore()
    res["rows"].append(row)
    print(json.dumps(row), flush=True)
    json.dump(res, open(f"{out_dir}/tune7.json", "w"), indent=1)
    del experts, x
    torch.cuda.empty_cache()

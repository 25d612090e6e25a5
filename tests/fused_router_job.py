"""Run by tests/test_fused_router.py in a fresh interpreter with TRITON_INTERPRET=1 and
PB_FUSED_ROUTER=1, the patched engine first on the path. Prints one JSON object."""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("PB_FUSED_ROUTER") == "1"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Glm4MoeConfig  # noqa: E402
from transformers._pb.ops import fused_router
from transformers._pb import knobs  # noqa: E402
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeTopkRouter  # noqa: E402

report = {"rows": []}
# The knob decides at model load: off, the router class keeps its forward; on, it takes the fused one.
knobs.load({})
fused_router.at_load()
report["off_keeps_upstream"] = Glm4MoeTopkRouter.forward is not fused_router.forward
knobs.load()
fused_router.at_load()
report["on_installs"] = Glm4MoeTopkRouter.forward is fused_router.forward


def upstream(fn):
    """Run fn with the router's own forward: upstream's path."""
    fused_router.restore()
    try:
        return fn()
    finally:
        fused_router.at_load()


torch.manual_seed(0)
# tokens, experts, top_k, groups, groups kept, norm, scale: GLM-4.5-Air's shape, the tiny
# model's, experts not a power of two, groups that keep every expert, one token, no rows
for tokens, experts, top_k, groups, kept, norm, scale in [
        (1, 128, 8, 1, 1, True, 1.0), (17, 128, 8, 1, 1, True, 1.0), (3, 8, 2, 1, 1, True, 1.0),
        (5, 96, 6, 1, 1, False, 2.5), (9, 16, 4, 4, 4, True, 1.5), (0, 128, 8, 1, 1, True, 1.0)]:
    config = Glm4MoeConfig(hidden_size=64, n_routed_experts=experts, num_experts_per_tok=top_k, n_group=groups,
                           topk_group=kept, norm_topk_prob=norm, routed_scaling_factor=scale)
    router = Glm4MoeTopkRouter(config)
    with torch.no_grad():
        router.weight.normal_(0, 0.5)
        router.e_score_correction_bias.normal_(0, 0.1)
    x = torch.randn(tokens, 64)
    with torch.no_grad():
        logits, ref_w, ref_i = upstream(lambda: router(x))
        fits = fused_router.fits(router, x)
        got_logits, w, i = router(x)
    same_experts = all(sorted(a) == sorted(b) for a, b in zip(ref_i.tolist(), i.tolist()))
    # weights compared expert by expert (the two orders differ)
    ref = [dict(zip(a, b)) for a, b in zip(ref_i.tolist(), ref_w.tolist())]
    got = [dict(zip(a, b)) for a, b in zip(i.tolist(), w.tolist())]
    diff = max((abs(r[e] - g.get(e, float("inf"))) for r, g in zip(ref, got) for e in r), default=0.0)
    descending = all(all(x >= y for x, y in zip(row, row[1:]))
                     for row in (torch.sigmoid(logits) + router.e_score_correction_bias).gather(1, i).tolist())
    report["rows"].append({"shape": [tokens, experts, top_k, groups, kept], "fits": fits, "same_experts": same_experts,
                           "max_weight_diff": diff, "descending": descending, "shape_out": list(w.shape),
                           "logits_equal": bool(torch.equal(logits, got_logits))})

# A group step that drops experts is not the kernel's: upstream's path, bit for bit.
config = Glm4MoeConfig(hidden_size=64, n_routed_experts=16, num_experts_per_tok=4, n_group=4, topk_group=2)
router = Glm4MoeTopkRouter(config)
with torch.no_grad():
    router.weight.normal_(0, 0.5)
    x = torch.randn(7, 64)
    ref = upstream(lambda: router(x))
    out = router(x)
report["dropping_groups"] = {"fits": fused_router.fits(router, x),
                             "equal": all(torch.equal(a, b) for a, b in zip(ref, out))}

# The tiny model: greedy replies with the knob on equal upstream's.
tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ids = tok("def fibonacci(n):", return_tensors="pt")["input_ids"]
with torch.no_grad():
    off = upstream(lambda: model.generate(ids, max_new_tokens=24, do_sample=False))
    on = model.generate(ids, max_new_tokens=24, do_sample=False)
report["tiny_greedy_equal"] = bool(torch.equal(off, on))
report["tiny_new_tokens"] = int(on.shape[1] - ids.shape[1])
print(json.dumps(report))

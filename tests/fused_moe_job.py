"""Run by tests/test_fused_moe.py in a fresh interpreter with TRITON_INTERPRET=1 (Triton's CPU
interpreter must be chosen before triton is imported) and the patched engine first on the
path. Prints one JSON object with what the test asserts on."""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Glm4MoeConfig  # noqa: E402
from transformers._pb.ops import fused_moe, stable_launch
from transformers._pb import knobs  # noqa: E402
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeExperts  # noqa: E402

torch.manual_seed(0)
report = {"kernel": []}
# tokens, experts, top_k, hidden, intermediate: odd sizes, more pairs than a block, one token
for tokens, experts, top_k, hidden, inter in [(1, 8, 2, 64, 32), (3, 8, 2, 48, 24), (17, 8, 3, 64, 32),
                                              (40, 16, 4, 80, 40), (5, 4, 2, 32, 16), (33, 8, 8, 64, 32)]:
    module = Glm4MoeExperts(Glm4MoeConfig(hidden_size=hidden, moe_intermediate_size=inter,
                                          n_routed_experts=experts, num_experts_per_tok=top_k))
    module.config._experts_implementation = "eager"
    with torch.no_grad():
        module.gate_up_proj.normal_(0, 0.1)
        module.down_proj.normal_(0, 0.1)
    x = torch.randn(tokens, hidden)
    # The last expert is never chosen (an empty group); with 3+ tokens one pair is masked
    # (an index past the experts, as when routed to another rank): it contributes nothing.
    index = torch.stack([torch.randperm(experts - 1)[:top_k] for _ in range(tokens)]) if top_k < experts \
        else torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
    if tokens > 2:
        index[1, 0] = experts
    weights = torch.rand(tokens, top_k)
    with torch.no_grad():
        ref = module(x, index, weights)
        out = fused_moe.experts_forward(module, x, index, weights)
    report["kernel"].append({"shape": [tokens, experts, top_k, hidden, inter],
                             "max_abs": (out - ref).abs().max().item(), "ref_max": ref.abs().max().item()})

# A step of more pairs than FUSED_MAX_PAIRS (a prefill) is upstream's grouped_mm, bit for bit.
from transformers.integrations.moe import grouped_mm_experts_forward  # noqa: E402

module = Glm4MoeExperts(Glm4MoeConfig(hidden_size=64, moe_intermediate_size=32, n_routed_experts=16,
                                      num_experts_per_tok=8))
with torch.no_grad():
    module.gate_up_proj.normal_(0, 0.1)
    module.down_proj.normal_(0, 0.1)
tokens = fused_moe.FUSED_MAX_PAIRS // 8 + 3
x = torch.randn(tokens, 64)
index = torch.stack([torch.randperm(16)[:8] for _ in range(tokens)])
weights = torch.rand(tokens, 8)
with torch.no_grad():
    report["prefill_is_grouped_mm"] = torch.equal(fused_moe.experts_forward(module, x, index, weights),
                                                  grouped_mm_experts_forward(module, x, index, weights))
    # Without the interpreter a CPU tensor cannot run Triton: upstream's grouped_mm answers.
    fused_moe.INTERPRET = False
    report["cpu_is_grouped_mm"] = torch.equal(fused_moe.experts_forward(module, x[:4], index[:4], weights[:4]),
                                              grouped_mm_experts_forward(module, x[:4], index[:4], weights[:4]))
    fused_moe.INTERPRET = True
    report["decode_is_fused"] = not torch.equal(fused_moe.experts_forward(module, x[:4], index[:4], weights[:4]),
                                                grouped_mm_experts_forward(module, x[:4], index[:4], weights[:4]))

# Tensor parallelism: each rank holds half of every expert's width ([gate; up] halves, the down
# projection's columns) while the module keeps the model's width; the two ranks' outputs sum to
# the whole layer's (the all-reduce upstream's TP plan adds after the experts).
module = Glm4MoeExperts(Glm4MoeConfig(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8,
                                      num_experts_per_tok=2))
with torch.no_grad():
    module.gate_up_proj.normal_(0, 0.1)
    module.down_proj.normal_(0, 0.1)
x, index, weights = torch.randn(3, 64), torch.stack([torch.randperm(8)[:2] for _ in range(3)]), torch.rand(3, 2)
parts = []
for rank in range(2):
    shard = Glm4MoeExperts(module.config)
    half = slice(16 * rank, 16 * rank + 16)
    with torch.no_grad():
        gate, up = module.gate_up_proj[:, :32], module.gate_up_proj[:, 32:]
        shard.gate_up_proj = torch.nn.Parameter(torch.cat([gate[:, half], up[:, half]], dim=1))
        shard.down_proj = torch.nn.Parameter(module.down_proj[:, :, half].contiguous())
        parts.append(fused_moe.experts_forward(shard, x, index, weights))
with torch.no_grad():
    whole = fused_moe.experts_forward(module, x, index, weights)
report["tp_shards_sum_to_whole"] = (parts[0] + parts[1] - whole).abs().max().item()

# A layout the kernels do not compute (another activation) is upstream's grouped_mm, bit for bit.
gelu = Glm4MoeExperts(Glm4MoeConfig(hidden_size=64, moe_intermediate_size=32, n_routed_experts=8,
                                    num_experts_per_tok=2, hidden_act="gelu"))
with torch.no_grad():
    gelu.gate_up_proj.normal_(0, 0.1)
    gelu.down_proj.normal_(0, 0.1)
    report["other_layout_is_grouped_mm"] = torch.equal(fused_moe.experts_forward(gelu, x, index, weights),
                                                       grouped_mm_experts_forward(gelu, x, index, weights))

# The sort into blocks: Triton's (one program up to ALIGN_MAX_PAIRS pairs, two launches of a
# program a chunk up to ALIGN_CHUNK_PAIRS) equals the torch ops, bit for bit, and never needs more
# blocks than the shape-only bound; chunks also in 0390's 128-row blocks.
report["align"] = []
for tokens, experts, top_k, block_m in [(1, 128, 8, 16), (3, 8, 2, 16), (8, 128, 8, 16), (17, 8, 3, 16),
                                        (32, 128, 8, 16), (5, 4, 2, 16), (40, 16, 4, 16), (1, 4, 4, 16),
                                        (40, 128, 8, 16), (129, 128, 8, 16), (70, 16, 4, 16), (300, 128, 8, 128)]:
    index = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)])
    if tokens > 2:
        index[1, 0] = experts  # masked
        index[2, 1] = -1  # masked the other way
    rows, blocks = fused_moe.align(index, experts, block_m)
    rows_t, blocks_t = fused_moe.align_torch(index, experts, block_m)
    stable_launch.STABLE = True  # 0450: one launch at the largest size, masked to the step
    rows_s, blocks_s = fused_moe.align(index, experts, block_m)
    stable_launch.STABLE = False
    kept = index.reshape(-1)
    kept = kept[(kept >= 0) & (kept < experts)]
    used = int((blocks >= 0).sum())
    needed = int(sum((c + block_m - 1) // block_m for c in torch.bincount(kept).tolist()))
    placed = sorted(r for r in rows.tolist() if r < tokens * top_k)
    report["align"].append({"shape": [tokens, experts, top_k, block_m], "equal": torch.equal(rows, rows_t)
                            and torch.equal(blocks, blocks_t), "used": used, "needed": needed,
                            "bound": blocks.numel() == fused_moe.max_blocks(tokens * top_k, experts, block_m),
                            "placed_once": placed == sorted(set(placed)) and len(placed) == kept.numel(),
                            "stable_equal": torch.equal(rows, rows_s) and torch.equal(blocks, blocks_s)})

# The whole tiny model: greedy ids and teacher-forced logprobs, eager experts vs pb_triton.
model_dir = sys.argv[1]
tok = AutoTokenizer.from_pretrained(model_dir)
fused_moe.register()
eager = AutoModelForCausalLM.from_pretrained(model_dir, experts_implementation="eager")
fused = AutoModelForCausalLM.from_pretrained(model_dir, experts_implementation=fused_moe.NAME)
report["fused_impl"] = fused.config._experts_implementation
report["models"] = []
for text in ["def fibonacci(n):", "The quick brown fox", "import os\nimport sys\n"]:
    ids = tok(text, return_tensors="pt").input_ids
    with torch.no_grad():
        a = eager.generate(ids, max_new_tokens=12, do_sample=False)
        b = fused.generate(ids, max_new_tokens=12, do_sample=False)
        la = torch.log_softmax(eager(a).logits.float(), -1)
        lb = torch.log_softmax(fused(a).logits.float(), -1)
    report["models"].append({"same_ids": a.tolist() == b.tolist(), "max_dlogprob": (la - lb).abs().max().item()})
os.environ["PB_FUSED_MOE"] = "1"
knobs.load()  # the knobs are read once, and the models above (0280's router hook) already read them
report["hook"] = fused_moe.model_kwargs({"dtype": "auto"})
print(json.dumps(report))

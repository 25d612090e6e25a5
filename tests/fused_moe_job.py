"""Run by tests/test_fused_moe.py in a fresh interpreter with TRITON_INTERPRET=1 (Triton's CPU
interpreter must be chosen before triton is imported) and the patched engine first on the
path. Prints one JSON object with what the test asserts on."""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, Glm4MoeConfig  # noqa: E402
from transformers._pb import fused_moe  # noqa: E402
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
report["hook"] = fused_moe.model_kwargs({"dtype": "auto"})
print(json.dumps(report))

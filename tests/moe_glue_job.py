"""Run by tests/test_moe_glue.py in a fresh interpreter with TRITON_INTERPRET=1, PB_MOE_COMBINE=1
and PB_MOE_GATE=1, the patched engine first on the path. Prints one JSON object."""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1" and os.environ.get("PB_MOE_COMBINE") == "1"
assert os.environ.get("PB_MOE_GATE") == "1"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers._pb import knobs
from transformers._pb.ops import moe_combine, moe_gate  # noqa: E402
from transformers.integrations import moe as upstream_moe  # noqa: E402

report = {}
knobs.load({})
moe_combine.at_load(), moe_gate.at_load()
report["off_disabled"] = moe_combine.ENABLED is False and moe_gate.ENABLED is False
knobs.load()
moe_combine.at_load(), moe_gate.at_load()
report["on_enabled"] = moe_combine.ENABLED is True and moe_gate.ENABLED is True


def inputs(tokens, top_k, hidden, rows_dtype, weights_dtype):
    """Pair outputs sorted by expert as the grouped_mm forward holds them, its sort permutation and
    the routing weights in (token, k) order."""
    experts = top_k + 5
    index = torch.stack([torch.randperm(experts)[:top_k] for _ in range(tokens)]) if tokens else \
        torch.zeros(0, top_k, dtype=torch.long)
    _, perm = torch.sort(index.reshape(-1))
    rows = (torch.randn(tokens * top_k, hidden) * 4).to(rows_dtype)
    weights = torch.rand(tokens, top_k).to(weights_dtype).reshape(-1)
    return rows, perm, weights


def upstream_tail(rows, perm, weights, tokens, top_k, out_dtype):
    """The last lines of upstream's grouped_mm forward, as they run on this CPU."""
    weighted = rows * weights[perm].unsqueeze(-1)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.size(0))
    weighted = weighted[inv_perm]
    return weighted.view(tokens, top_k, rows.shape[-1]).sum(dim=1).to(out_dtype)


def cuda_order(rows, perm, weights, tokens, top_k, out_dtype):
    """The same arithmetic with the K products added in the order torch's CUDA reduction adds them:
    element k into accumulator k % 4, then ((a0 + a1) + a2) + a3 (each step an exact IEEE op)."""
    prod_dtype = torch.promote_types(rows.dtype, weights.dtype)
    inv_perm = perm.argsort()  # inv_perm[p]: where pair p's row lies among the sorted rows
    products = (rows[inv_perm].float() * weights.float().unsqueeze(-1)).to(prod_dtype).float()
    products = products.view(tokens, top_k, rows.shape[-1])
    acc = [torch.zeros(tokens, rows.shape[-1]) for _ in range(4)]
    for k in range(top_k):
        acc[k % 4] = acc[k % 4] + products[:, k]
    return (((acc[0] + acc[1]) + acc[2]) + acc[3]).to(prod_dtype).to(out_dtype)


def within_rounding(got, ref, rows, perm, weights, top_k):
    """Whether every output is within a last-place step of `ref` plus what another order of adding
    K float32 products can move a sum: (K - 1) float32 epsilons of the sum of their magnitudes."""
    if got.numel() == 0:
        return True
    inv_perm = perm.argsort()  # inv_perm[p]: where pair p's row lies among the sorted rows
    magnitude = (rows[inv_perm].float() * weights.float().unsqueeze(-1)).abs().view(got.shape[0], top_k, -1).sum(1)
    step = torch.finfo(ref.dtype).eps * ref.float().abs()
    bound = step + (top_k - 1) * torch.finfo(torch.float32).eps * magnitude
    return bool(((got.float() - ref.float()).abs() <= bound).all())


torch.manual_seed(0)
report["cases"] = []
# tokens, top_k, hidden: GLM-4.5's top-8 at a small width, a width that is not a multiple of the
# block, top-k 1, 3, 5 and 16 (the most the kernel takes), no tokens
for rows_dtype, weights_dtype, out_dtype in [(torch.bfloat16, torch.float32, torch.bfloat16),
                                             (torch.bfloat16, torch.bfloat16, torch.bfloat16),
                                             (torch.float16, torch.float32, torch.float16),
                                             (torch.float32, torch.float32, torch.float32)]:
    for tokens, top_k, hidden in [(7, 8, 256), (3, 8, 1500), (5, 1, 64), (4, 3, 96), (6, 5, 128),
                                  (2, 16, 64), (0, 8, 64)]:
        rows, perm, weights = inputs(tokens, top_k, hidden, rows_dtype, weights_dtype)
        got = moe_combine.combine(rows, perm, weights, tokens, top_k, out_dtype)
        ref = cuda_order(rows, perm, weights, tokens, top_k, out_dtype)
        cpu = upstream_tail(rows, perm, weights, tokens, top_k, out_dtype)
        report["cases"].append({
            "dtypes": [str(rows_dtype), str(weights_dtype)], "shape": [tokens, top_k, hidden],
            "ran": got is not None, "dtype_ok": got is not None and got.dtype == cpu.dtype,
            "shape_ok": got is not None and got.shape == cpu.shape,
            "equal_cuda_order": got is not None and torch.equal(got, ref),
            "near_upstream_cpu": got is not None and within_rounding(got, cpu, rows, perm, weights, top_k)})

rows, perm, weights = inputs(3, 17, 64, torch.bfloat16, torch.float32)
report["top_k_17_refused"] = moe_combine.combine(rows, perm, weights, 3, 17, torch.bfloat16) is None

# The gate: silu(gate) * up against upstream's default gate on this CPU (the interpreter's exp is
# numpy's, so the last place may differ); GLM-4.5-Air's width, an odd width, a row, no rows.
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, experts_implementation="grouped_mm")
experts = next(m for m in model.modules() if type(m).__name__ == "Glm4MoeExperts")
report["gate"] = []
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for rows, inter in [(9, 1408), (4, 300), (1, 64), (0, 64)]:
        x = (torch.randn(rows, 2 * inter) * 4).to(dtype)
        got = moe_gate.apply_gate(experts, x)
        ref = upstream_moe._default_apply_gate(experts, x)
        step = torch.finfo(dtype).eps * ref.double().abs()
        report["gate"].append({"dtype": str(dtype), "shape": [rows, inter], "fits": moe_gate.fits(experts, x),
                               "dtype_ok": got.dtype == ref.dtype, "shape_ok": got.shape == ref.shape,
                               "steps": float(((got.double() - ref.double()).abs() / step.clamp_min(1e-300)).max())
                               if rows else 0.0,
                               "share_equal": float((got == ref).float().mean()) if rows else 1.0})
strided = torch.randn(6, 2 * 64).bfloat16()[:, ::1].t().contiguous().t()  # a column-major view
report["gate_other_layout_runs_upstream"] = (not moe_gate.fits(experts, strided)
                                            and torch.equal(moe_gate.apply_gate(experts, strided),
                                                            upstream_moe._default_apply_gate(experts, strided)))

# The whole grouped_mm experts forward of the tiny model's first MoE layer, knobs on against off.
tokens, top_k = 13, model.config.num_experts_per_tok
hidden = torch.randn(tokens, model.config.hidden_size).bfloat16()
index = torch.stack([torch.randperm(model.config.n_routed_experts)[:top_k] for _ in range(tokens)])
top_w = torch.rand(tokens, top_k)
combined = []
real = moe_combine.combine


def counted(*args):
    out = real(*args)
    combined.append(out is not None)
    return out


moe_combine.combine = counted
on = upstream_moe.grouped_mm_experts_forward(experts, hidden, index, top_w)
moe_combine.restore(), moe_gate.restore()
off = upstream_moe.grouped_mm_experts_forward(experts, hidden, index, top_w)
moe_combine.combine = real
step = torch.finfo(torch.bfloat16).eps * off.float().abs()
report["experts"] = {"combined": combined, "dtype_ok": on.dtype == off.dtype, "shape_ok": on.shape == off.shape,
                     "within_a_step": bool(((on.float() - off.float()).abs() <= step).all())}

# Greedy replies of the tiny model, knobs on against off.
knobs.load()
moe_combine.at_load(), moe_gate.at_load()
prompt = torch.tensor([[1, 5, 9, 14, 3, 22, 7]])
with torch.no_grad():
    on_ids = model.generate(prompt, max_new_tokens=16, do_sample=False)
    moe_combine.restore(), moe_gate.restore()
    off_ids = model.generate(prompt, max_new_tokens=16, do_sample=False)
report["tiny_greedy_equal"] = torch.equal(on_ids, off_ids)
print(json.dumps(report))

"""Run by tests/test_fused_layers.py in a fresh interpreter with TRITON_INTERPRET=1,
PB_FUSED_ROPE=1, PB_FUSED_NORM=1 and PB_FUSED_PROJ=1, the patched engine first on the path.
Prints one JSON object."""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"
assert os.environ.get("PB_FUSED_ROPE") == "1" and os.environ.get("PB_FUSED_NORM") == "1"
assert os.environ.get("PB_FUSED_PROJ") == "1"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers._pb.ops import fused_norm, fused_proj, fused_rope
from transformers._pb import knobs  # noqa: E402
from transformers.models.glm4_moe import modeling_glm4_moe as modeling  # noqa: E402

report = {}
# Both decide at model load: off, upstream's function and class stay; on, the fused ones take their place.
knobs.load({})
fused_rope.at_load(), fused_norm.at_load()
report["off_keeps_upstream"] = (modeling.apply_rotary_pos_emb is not fused_rope.apply_rotary_pos_emb
                                and modeling.Glm4MoeRMSNorm.forward is not fused_norm.forward)
knobs.load()
fused_rope.at_load(), fused_norm.at_load()
report["on_installs"] = (modeling.apply_rotary_pos_emb is fused_rope.apply_rotary_pos_emb
                         and modeling.Glm4MoeRMSNorm.forward is fused_norm.forward)
upstream_rope, upstream_norm = fused_rope.SWAP.upstream(), fused_norm.SWAP.upstream()


def rope_inputs(dtype, batch, seq, heads, kv_heads, dim, rotary, cos_batch=None):
    """q and k as the attention makes them: views of one projection output, transposed to [b, h, s, d]."""
    proj = (torch.randn(batch, seq, (heads + 2 * kv_heads) * dim) * 3).to(dtype)
    q = proj[..., : heads * dim].view(batch, seq, heads, dim).transpose(1, 2)
    k = proj[..., heads * dim: (heads + kv_heads) * dim].view(batch, seq, kv_heads, dim).transpose(1, 2)
    pos = (torch.arange(seq) * 37 + 5)[None].expand(cos_batch or batch, seq).float()
    freqs = pos[..., None] / 10000 ** (torch.arange(0, rotary, 2).float() / rotary)
    emb = torch.cat((freqs, freqs), dim=-1)
    return q, k, emb.cos().to(dtype), emb.sin().to(dtype)


torch.manual_seed(0)
report["rope"] = []
# batch, seq, heads, kv heads, head_dim, rotary_dim: GLM-4.5-Air's decode (96 / 8 heads, half rotary),
# a prefill, batch 2 with cos shared across the batch, full rotary, a tiny head; then steps long enough
# for blocks of tokens a program (one not a multiple of the block; batch 2, a block spanning both)
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for shape in [(1, 1, 96, 8, 128, 64), (1, 9, 4, 2, 128, 64), (2, 3, 4, 1, 64, 64), (1, 5, 3, 3, 16, 8),
                  (1, 37, 4, 2, 128, 64), (2, 20, 3, 1, 64, 32)]:
        q, k, cos, sin = rope_inputs(dtype, *shape, cos_batch=1 if shape[0] == 2 else None)
        ref = upstream_rope(q, k, cos, sin)
        got = fused_rope.apply_rotary_pos_emb(q, k, cos, sin)
        report["rope"].append({"dtype": str(dtype), "shape": shape, "fits": fused_rope.fits(q, k, cos, sin, 1),
                               "equal": all(torch.equal(a, b) for a, b in zip(ref, got)),
                               "strides": all(a.stride() == b.stride() for a, b in zip(ref, got)),
                               "changed": not torch.equal(ref[0], q)})
# A layout the kernel does not take (cos for unsqueeze_dim=2) runs upstream's function.
q, k, cos, sin = rope_inputs(torch.float32, 1, 4, 2, 2, 16, 8)
qt, kt = q.transpose(1, 2), k.transpose(1, 2)
report["rope_other_layout"] = {"fits": fused_rope.fits(qt, kt, cos, sin, 2),
                               "equal": all(torch.equal(a, b) for a, b in zip(
                                   upstream_rope(qt, kt, cos, sin, 2), fused_rope.apply_rotary_pos_emb(qt, kt, cos, sin, 2)))}

report["norm"] = []
# rows of GLM-4.5-Air's hidden size (decode, prefill), head-sized rows, an odd width, no rows,
# and a float32 weight on bfloat16 rows (torch promotes the output to float32)
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for shape, weight_dtype in [((1, 1, 4096), None), ((1, 7, 4096), None), ((3, 5, 128), None), ((4, 1000), None),
                                ((0, 4096), None), ((2, 3, 64), torch.float32)]:
        norm = modeling.Glm4MoeRMSNorm(shape[-1], eps=1e-5).to(weight_dtype or dtype)
        with torch.no_grad():
            norm.weight.normal_(1, 0.2)
            x = (torch.randn(shape) * 3).to(dtype)
            ref, got = upstream_norm(norm, x), norm(x)
        diff = (ref.float() - got.float()).abs()
        scale = ref.float().abs().clamp_min(1e-3)
        report["norm"].append({"dtype": str(dtype), "shape": shape, "fits": fused_norm.fits(norm, x),
                               "same_dtype": ref.dtype == got.dtype, "same_shape": ref.shape == got.shape,
                               "max_rel_diff": float((diff / scale).max()) if ref.numel() else 0.0,
                               "share_differing": float((ref != got).float().mean()) if ref.numel() else 0.0})

# The tiny model: greedy replies with both knobs on equal upstream's, and both kernels ran.
calls = {"rope": 0, "norm": 0}
rope_kernels, norm_kernels = fused_rope.kernels("fused_rope"), fused_norm.kernels("fused_norm")
rope_kernel, norm_kernel = rope_kernels.pb_rope, norm_kernels.pb_rms_norm


class Counted:
    def __init__(self, kernel, key):
        self.kernel, self.key = kernel, key

    def __getitem__(self, grid):
        calls[self.key] += 1
        return self.kernel[grid]


tok = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
ids = tok("def fibonacci(n):", return_tensors="pt")["input_ids"]
with torch.no_grad():
    fused_rope.restore(), fused_norm.restore()
    off = model.generate(ids, max_new_tokens=24, do_sample=False)
    fused_rope.at_load(), fused_norm.at_load()
    rope_kernels.pb_rope, norm_kernels.pb_rms_norm = Counted(rope_kernel, "rope"), Counted(norm_kernel, "norm")
    on = model.generate(ids, max_new_tokens=24, do_sample=False)
report["tiny_greedy_equal"] = bool(torch.equal(off, on))
report["tiny_new_tokens"] = int(on.shape[1] - ids.shape[1])
report["tiny_calls"] = calls
report["tiny_layers"] = model.config.num_hidden_layers

# 0310 on the tiny model (float32, the CPU's BLAS): the fused projections give upstream's
# logits and greedy reply; the originals become views of the fused rows; restore goes back.
fused_rope.restore(), fused_norm.restore()
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
with torch.no_grad():
    ref_logits = model(ids).logits
    params = sum(p.numel() for p in model.parameters())
    fused_proj.after_load(model)
    attn, shared = model.model.layers[-1].self_attn, model.model.layers[-1].mlp.shared_experts
    logits = model(ids).logits
    on = model.generate(ids, max_new_tokens=24, do_sample=False)
    fused_proj.restore()
    restored = model(ids).logits
report["proj"] = {
    "fused": [attn.pb_qkv is None, shared.pb_gate_up is None],  # after restore
    "views": attn.q_proj.weight.untyped_storage().data_ptr() == attn.v_proj.weight.untyped_storage().data_ptr(),
    "same_params": params == sum(p.numel() for p in model.parameters()),
    "max_logit_diff": float((logits - ref_logits).abs().max()), "greedy_equal": bool(torch.equal(on, off)),
    "restored_equal": bool(torch.equal(restored, ref_logits))}


class Quantized(torch.nn.Linear):
    """A Linear subclass stands in for a layer the fusion must not touch (quantized, sharded)."""


config = model.config
block = modeling.Glm4MoeAttention(config, layer_idx=0)
block.k_proj = Quantized(config.hidden_size, block.k_proj.out_features, bias=block.k_proj.bias is not None)
report["proj_other_layers"] = {"attention_fused": fused_proj._fuse(block, fused_proj.QKV, "pb_qkv"),
                               "mlp_fused": fused_proj._fuse(modeling.Glm4MoeMLP(config), fused_proj.GATE_UP,
                                                             "pb_gate_up")}
print(json.dumps(report))

"""Which of a decode step's operations give a row other bits when other rows share the step.

    python -m patchbay.device invariance --out DIR [--device cuda] [--rows 1,2,8,32,64,65,512]

Issue 7 asks that the production config keep batched == alone: a request's tokens must not
depend on which other requests the engine batches with it. W08-W09 measured that it does not
hold (teacher-forced, batched against alone: mean |Δ logprob| about 0.025). This probe finds
where: each operation of a GLM-4.5-Air layer, at air12's shapes, runs on a first row alone (one
row) and then with other rows around it (N rows, the first the same), and the first row's outputs
are compared bit for bit. The operations are the engine's own functions with the production knobs'
kernels where a knob replaces one (RMSNorm 0300, rotary 0290, the router's expert choice 0280, the
MoE experts 0220 with grouped_mm above its decode size, the combine and gate 0320/0330), the GEMMs
as `F.linear` runs them (q/k/v fused as 0310 fuses them, o_proj, the shared expert's gate/up and
down, the router's float32 logits, the LM head), and attention both as upstream's sdpa over the
step's block-diagonal mask and through 0370's kernel. PB_* knobs in the environment take effect as
a model load applies them (`load_hooks.apply`), so PB_INVARIANT_GEMM=1 probes the GEMMs as 0380
runs them; the knobs are recorded with the results.

Writes DIR/invariance.json: per operation and row count, whether the first row's bits equal its
bits alone, and the largest difference. On a CPU (the tests) the shapes are cut down and the
Triton kernels run through the interpreter when TRITON_INTERPRET=1; the figures that matter come
from the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

DEFAULT_ROWS = (1, 2, 8, 32, 64, 65, 512)


def shapes(small: bool) -> dict:
    """GLM-4.5-Air's widths (air12), or a cut-down set for the CPU."""
    if small:
        return dict(hidden=64, heads=4, kv_heads=2, head_dim=16, rotary=8, moe_inter=32, shared_inter=32,
                    experts=16, top_k=4, vocab=256)
    return dict(hidden=4096, heads=96, kv_heads=8, head_dim=128, rotary=64, moe_inter=1408, shared_inter=1408,
                experts=128, top_k=8, vocab=151552)


def operations(device: str, small: bool, seed: int = 0) -> dict:
    """name -> function(x: [rows, hidden] bf16) -> tensor whose first row belongs to x's first row."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from transformers import Glm4MoeConfig
    from transformers._pb.ops import (fused_moe, fused_norm, fused_rope, fused_router, moe_combine, moe_gate,
                                      varlen_attention)
    from transformers.integrations.moe import grouped_mm_experts_forward
    from transformers.models.glm4_moe import modeling_glm4_moe as modeling

    s = shapes(small)
    g = torch.Generator(device="cpu").manual_seed(seed)

    def weight(*shape, scale=0.02, dtype=torch.bfloat16):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    qkv_out = (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]
    w_qkv, b_qkv = weight(qkv_out, s["hidden"]), weight(qkv_out)
    w_o = weight(s["hidden"], s["heads"] * s["head_dim"])
    w_gu, w_down = weight(2 * s["shared_inter"], s["hidden"]), weight(s["hidden"], s["shared_inter"])
    w_router = weight(s["experts"], s["hidden"], dtype=torch.float32)
    w_head = weight(s["vocab"], s["hidden"])

    config = Glm4MoeConfig(hidden_size=s["hidden"], moe_intermediate_size=s["moe_inter"],
                           n_routed_experts=s["experts"], num_experts_per_tok=s["top_k"], n_group=1, topk_group=1,
                           norm_topk_prob=True, routed_scaling_factor=1.0, hidden_act="silu")
    experts = modeling.Glm4MoeExperts(config).to(device=device, dtype=torch.bfloat16)
    router = modeling.Glm4MoeTopkRouter(config).to(device)
    norm = modeling.Glm4MoeRMSNorm(s["hidden"], eps=1e-5).to(device=device, dtype=torch.bfloat16)
    with torch.no_grad():
        experts.gate_up_proj.copy_(weight(*experts.gate_up_proj.shape))
        experts.down_proj.copy_(weight(*experts.down_proj.shape))
        router.weight.copy_(w_router)
        router.e_score_correction_bias.copy_(weight(s["experts"], scale=0.01, dtype=torch.float32))
        norm.weight.copy_(weight(s["hidden"], scale=0.2) + 1)
    upstream_norm = fused_norm.SWAP.upstream()
    upstream_rope = fused_rope.SWAP.upstream()
    upstream_router = fused_router.SWAP.upstream()

    def rope(x):
        rows = x.shape[0]
        q = F.linear(x, w_qkv, b_qkv)[:, : s["heads"] * s["head_dim"]]
        q = q.view(1, rows, s["heads"], s["head_dim"]).transpose(1, 2)
        k = q[:, : s["kv_heads"]]
        pos = torch.full((1, rows), 100.0, device=device)  # the same position each row
        freqs = pos[..., None] / 10000 ** (torch.arange(0, s["rotary"], 2, device=device).float() / s["rotary"])
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        fn = fused_rope.apply_rotary_pos_emb if fused_rope.fits(q, k, cos, sin, 1) else upstream_rope
        return fn(q, k, cos, sin)[0][0].transpose(0, 1)

    def moe(x):
        logits = F.linear(x.float(), router.weight)
        weights, index = (fused_router.select(router, logits) if fused_router.fits(router, x)
                          else upstream_router(router, x)[1:])
        return fused_moe.experts_forward(experts, x, index, weights)

    def grouped(x):
        index = torch.arange(s["top_k"], device=device).expand(x.shape[0], -1)  # every row the same experts
        weights = torch.full(index.shape, 1.0 / s["top_k"], device=device)
        return grouped_mm_experts_forward(experts, x, index, weights)

    def norm_row(x):
        return fused_norm.forward(norm, x) if fused_norm.fits(norm, x) else upstream_norm(norm, x)

    kv_len = 40 if small else 300  # the first sequence's cached keys; the others' grow by 17 each

    def decode_step(x):
        """One decode token per sequence, packed as the batching engine packs a step: all queries
        in one row of the batch, all sequences' keys after each other. Returns the queries
        [1, heads, rows, dim], keys and values [1, kv_heads, keys, dim] and each sequence's length."""
        rows = x.shape[0]
        q = F.linear(x, w_qkv, b_qkv)[:, : s["heads"] * s["head_dim"]].reshape(1, rows, s["heads"], s["head_dim"])
        lengths = [kv_len + 17 * i for i in range(rows)]
        # the first sequence's keys and values are the same whatever the batch; the others follow them
        first = torch.randn(kv_len, 2, s["kv_heads"], s["head_dim"], generator=torch.Generator().manual_seed(2))
        others = torch.randn(sum(lengths) - kv_len, 2, s["kv_heads"], s["head_dim"],
                             generator=torch.Generator().manual_seed(3))
        kv = torch.cat([first, others]).to(device=device, dtype=x.dtype)
        return q.transpose(1, 2), kv[:, 0].transpose(0, 1)[None], kv[:, 1].transpose(0, 1)[None], lengths

    def attention(x):
        """sdpa over the step with a block-diagonal mask, as upstream's paged path attends."""
        q, k, v, lengths = decode_step(x)
        rows = x.shape[0]
        mask = torch.full((rows, sum(lengths)), torch.finfo(x.dtype).min, device=device, dtype=x.dtype)
        start = 0
        for i, n in enumerate(lengths):
            mask[i, start: start + n] = 0
            start += n
        # torch's CPU flash kernel wants instructions some CPUs lack (bf16 VNNI packing): the math
        # backend there, which the CPU test only needs to run
        backend = sdpa_kernel(SDPBackend.MATH) if x.device.type == "cpu" else contextlib.nullcontext()
        with backend:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None], enable_gqa=True)
        return out.transpose(1, 2).reshape(rows, -1)

    def varlen(x):
        """The same step through 0370's kernel: each sequence's own keys, no mask."""
        q, k, v, lengths = decode_step(x)
        rows = x.shape[0]
        cu_k = torch.tensor([0] + lengths, device=device).cumsum(0).to(torch.int32)
        cu_q = torch.arange(rows + 1, device=device, dtype=torch.int32)
        saved, varlen_attention.ENABLED = varlen_attention.ENABLED, True
        try:
            out = varlen_attention.forward(SimpleNamespace(), q, k, v, s["head_dim"] ** -0.5,
                                           {"cu_seq_lens_q": cu_q, "cu_seq_lens_k": cu_k})
        finally:
            varlen_attention.ENABLED = saved
        return out.reshape(rows, -1)

    moe_combine.ENABLED = moe_gate.ENABLED = True
    ops = {
        "qkv GEMM (0310 fused, bias)": lambda x: F.linear(x, w_qkv, b_qkv),
        "o_proj GEMM": lambda x: F.linear(torch.cat([x] * (s["heads"] * s["head_dim"] // s["hidden"]), -1), w_o),
        "shared expert gate/up GEMM": lambda x: F.linear(x, w_gu),
        "shared expert down GEMM": lambda x: F.linear(x[:, : s["shared_inter"]].contiguous(), w_down),
        "router logits GEMM (float32)": lambda x: F.linear(x.float(), w_router),
        "LM head GEMM": lambda x: F.linear(x, w_head),
        "attention (sdpa, the step's block-diagonal mask)": attention,
        "RMSNorm (0300)": norm_row,
        "rotary (0290)": rope,
        "MoE: router 0280 + experts 0220 (grouped_mm above the decode size)": moe,
        "MoE: grouped_mm with 0320/0330": grouped,
    }
    if device != "cpu" or varlen_attention.INTERPRET:
        ops["attention (0370 varlen kernel)"] = varlen
    return ops


def probe(device: str, rows: list[int], small: bool) -> list[dict]:
    """Each operation's first row, alone and among N rows: equal bits, largest difference."""
    import torch

    ops = operations(device, small)
    hidden = shapes(small)["hidden"]
    g = torch.Generator(device="cpu").manual_seed(1)
    most = max(rows)
    x_all = (torch.randn(most, hidden, generator=g)).to(device=device, dtype=torch.bfloat16)
    out = []
    with torch.no_grad():
        for name, fn in ops.items():
            alone = fn(x_all[:1])[0].float()
            for n in rows:
                if n == 1:
                    continue
                first = fn(x_all[:n])[0].float()
                out.append({"op": name, "rows": n, "equal": bool(torch.equal(first, alone)),
                            "max_abs_diff": float((first - alone).abs().max()),
                            "share_differing": float((first != alone).float().mean())})
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m patchbay.device invariance")
    p.add_argument("--out", required=True)
    p.add_argument("--device", default="cuda")
    p.add_argument("--rows", default=",".join(map(str, DEFAULT_ROWS)), help="row counts to set the first row among")
    p.add_argument("--small", action="store_true", help="cut-down widths (the CPU test)")
    args = p.parse_args(argv)
    try:
        rows = sorted({int(r) for r in args.rows.split(",")})
    except ValueError:
        raise SystemExit(f"--rows {args.rows!r}: expected comma-separated row counts, e.g. 1,8,64") from None
    if not rows or rows[0] < 1:
        raise SystemExit(f"--rows {args.rows!r}: row counts start at 1")
    from ..runtime import load_hooks

    load_hooks.apply()  # knobs that replace an operation process-wide (0380's GEMMs) take effect
    knobs = {k: v for k, v in sorted(os.environ.items()) if k.startswith("PB_")}
    results = probe(args.device, rows, args.small)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "invariance.json").write_text(json.dumps({"device": args.device, "rows": rows, "knobs": knobs,
                                                     "results": results}, indent=1) + "\n")
    for name in dict.fromkeys(r["op"] for r in results):
        mine = [r for r in results if r["op"] == name]
        differ = [str(r["rows"]) for r in mine if not r["equal"]]
        print(f"{name}: {'same bits at every row count' if not differ else 'differs at ' + ', '.join(differ) + ' rows'}")
    return 0

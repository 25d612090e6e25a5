"""sdpa on GLM-4.5-Air's attention shape for one 8K prompt: masked square vs causal, per backend."""
import json
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

T, H, KV, D = 8192, 96, 8, 128
q = torch.randn(1, H, T, D, device="cuda", dtype=torch.bfloat16)
k = torch.randn(1, KV, T, D, device="cuda", dtype=torch.bfloat16)
v = torch.randn(1, KV, T, D, device="cuda", dtype=torch.bfloat16)
kr, vr = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
mask = torch.full((T, T), torch.finfo(torch.bfloat16).min, device="cuda", dtype=torch.bfloat16).triu(1)[None, None]
B = SDPBackend


def timed(fn, backends=None):
    ctx = sdpa_kernel(backends, set_priority=True) if backends else torch.no_grad()
    try:
        with ctx:
            out = fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                fn()
            end.record()
            torch.cuda.synchronize()
        return round(start.elapsed_time(end) / 10, 3), out
    except Exception as e:
        return f"{type(e).__name__}: {str(e)[:80]}", None


sdpa = torch.nn.functional.scaled_dot_product_attention
rows = {}
ref_t, ref = timed(lambda: sdpa(q, kr, vr, attn_mask=mask))
rows["masked square, repeated kv (the masked path)"] = ref_t
for name, fn in [("causal, enable_gqa", lambda: sdpa(q, k, v, is_causal=True, enable_gqa=True)),
                 ("causal, repeated kv", lambda: sdpa(q, kr, vr, is_causal=True))]:
    for label, order in [("default", None), ("flash first", [B.FLASH_ATTENTION, B.CUDNN_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH]),
                         ("cudnn first", [B.CUDNN_ATTENTION, B.FLASH_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH]),
                         ("efficient first", [B.EFFICIENT_ATTENTION, B.FLASH_ATTENTION, B.CUDNN_ATTENTION, B.MATH])]:
        t, out = timed(fn, order)
        diff = None if out is None or ref is None else round(float((out.float() - ref.float()).abs().max()), 4)
        rows[f"{name}, {label}"] = [t, diff]
print(json.dumps({"ms_per_call_one_layer": rows, "torch": torch.__version__}, indent=1))

"""KV formats on air12-fp8, simulated: one model in memory (PB_FP8_WEIGHTS products), the reference
texts forced through it with every attention's keys and values rounded to a format before sdpa, each
token's logprob against the same run with bf16 keys and values. Also kernel-noise floors: sdpa's math
backend, float32 attention, and W58's server arm A (production kernels, bf16 cache)."""
import json, os, sys, time
from pathlib import Path

import torch

os.environ["PB_FP8_WEIGHTS"] = "1"
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from patchbay.device.servers import AIR12_FP8, build_model
from patchbay.measure.exact import reference_texts
from patchbay.runtime import load_hooks
from patchbay.runtime.synth import padded_tokenizer

out = Path(sys.argv[1])


def bf16(t):
    return t


def _pow2(amax, top):
    m, e = torch.frexp(amax / top)
    return torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), e - (m == 0.5).int()), torch.ones_like(amax))


def blocked(fn, size):
    def f(t):
        s = t.shape
        return fn(t.reshape(*s[:-1], s[-1] // size, size)).reshape(s)
    return f


def e4m3p2(t):
    x = t.float()
    scale = _pow2(x.abs().amax(-1, keepdim=True), 448.0)
    return ((x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale).to(t.dtype)


def e4m3f(t):
    x = t.float()
    amax = x.abs().amax(-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 448, torch.ones_like(amax))
    return ((x / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale).to(t.dtype)


def int8(t):
    x = t.float()
    scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    return ((x / scale).round().clamp(-127, 127) * scale).to(t.dtype)


def int8p2(t):
    x = t.float()
    scale = _pow2(x.abs().amax(-1, keepdim=True), 127.0)
    return ((x / scale).round().clamp(-127, 127) * scale).to(t.dtype)


F = {"bf16": bf16, "e4m3p2": e4m3p2, "e4m3f": e4m3f, "int8": int8, "int8p2": int8p2,
     "int8b32": blocked(int8, 32), "e4m3b32": blocked(e4m3p2, 32), "int8b64": blocked(int8, 64)}
COMBOS = [("e4m3p2", "e4m3p2"), ("int8", "int8"), ("int8p2", "int8p2"), ("int8b32", "int8b32"),
          ("int8b64", "int8b64"), ("bf16", "e4m3p2"), ("bf16", "int8"), ("bf16", "int8b32"), ("e4m3p2", "bf16"),
          ("int8", "bf16"), ("int8b32", "bf16"), ("int8", "e4m3p2"), ("e4m3f", "e4m3f")]
state = {"k": bf16, "v": bf16, "fp32": False, "math": False}


def attention(module, query, key, value, mask, **kw):
    k, v = state["k"](key), state["v"](value)
    if state["fp32"]:
        o, w = sdpa_attention_forward(module, query.float(), k.float(), v.float(), mask, **kw)
        return o.to(query.dtype), w
    if state["math"]:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel(SDPBackend.MATH):
            return sdpa_attention_forward(module, query, k, v, mask, **kw)
    return sdpa_attention_forward(module, query, k, v, mask, **kw)


AttentionInterface.register("pb_kv_sim", attention)
t0 = time.monotonic()
DEV = "cpu" if os.environ.get("KV_SIM_SMALL") else "cuda"
if DEV == "cpu":  # a dry run of this script on a small model
    from patchbay.runtime.synth import air_config, build_air12
    cfg = air_config(2)
    cfg.hidden_size, cfg.intermediate_size, cfg.moe_intermediate_size, cfg.num_attention_heads = 256, 512, 128, 8
    cfg.n_routed_experts = 8
    model = build_air12("cpu", config=cfg)
else:
    model = build_model(AIR12_FP8)
    load = load_hooks.sequence()
    load.before({})
    load.after(model)
model.set_attn_implementation("pb_kv_sim")
tok = padded_tokenizer(model.config.vocab_size)
print(f"built in {time.monotonic() - t0:.0f}s attn={model.config._attn_implementation}", flush=True)
texts = []
for messages, reply in reference_texts():
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
    target = tok(reply, add_special_tokens=False)["input_ids"]
    texts.append((prompt, target))


def logprobs():
    res = []
    with torch.inference_mode():
        for prompt, target in texts:
            ids = torch.tensor([prompt + target], device=DEV)
            lp = model(ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
            res.append(lp.gather(-1, torch.tensor(target, device=DEV)[:, None])[:, 0].tolist())
    return res


def compare(ref, got):
    per = [[abs(a - b) for a, b in zip(r, g)] for r, g in zip(ref, got)]
    flat = [d for p in per for d in p]
    return {"tokens": len(flat), "mean_abs": round(sum(flat) / len(flat), 4), "max_abs": round(max(flat), 3),
            "per_text_mean": [round(sum(p) / len(p), 4) for p in per]}


ref = logprobs()
again = logprobs()
rows = {"reference again (determinism)": compare(ref, again)}
print(rows, flush=True)
served = json.loads(Path("results/W58-kv-fp8/api-h100/score-A.json").read_text())["logprobs"]
if [len(x) for x in served] == [len(t) for _, t in texts]:
    rows["W58 server arm A (prod kernels, bf16 cache) vs this"] = compare(ref, served)
else:
    rows["W58 arm A"] = {"lengths": [len(x) for x in served], "here": [len(t) for _, t in texts]}
for name, flag in (("sdpa math backend", "math"), ("float32 attention", "fp32")):
    state[flag] = True
    rows[name] = compare(ref, logprobs())
    state[flag] = False
    print(name, rows[name], flush=True)
for k, v in COMBOS:
    state["k"], state["v"] = F[k], F[v]
    t1 = time.monotonic()
    rows[f"keys {k}, values {v}"] = compare(ref, logprobs())
    print(k, v, rows[f"keys {k}, values {v}"], f"{time.monotonic() - t1:.1f}s", flush=True)
(out / "kv_sim.json").write_text(json.dumps(rows, indent=1))

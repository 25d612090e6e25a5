"""Teacher-forced |Δ logprob| of KV formats on synthetic:trained (float32, on the CPU): the keys and
values each attention reads are rounded to a format, the reference texts of `patchbay score` are
forced through the model, and each token's logprob is compared with the same run over keys and
values rounded to bfloat16 (what a bf16 cache holds). Formats: 0830's (e4m3 with a power-of-two
scale a token and KV head), int8 with a float scale a token and KV head, and e4m3 for only the
keys or only the values. Run with the repository's src/ on sys.path:
    python kv_formats.py .cache/models/trained-s0-c65536"""
import json
import sys

import torch
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from patchbay.measure.exact import reference_texts


def bf16(t):
    return t.to(torch.bfloat16).to(t.dtype)


def e4m3(t):  # 0830's rows: the smallest power of two that brings a head's largest magnitude to <= 448
    amax = t.abs().amax(-1, keepdim=True)
    m, e = torch.frexp(amax / 448)
    scale = torch.where(amax > 0, torch.ldexp(torch.ones_like(amax), e - (m == 0.5).int()), torch.ones_like(amax))
    return bf16((t / scale).clamp(-448, 448).to(torch.float8_e4m3fn).to(t.dtype) * scale)


def int8(t):
    scale = t.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127
    return bf16((t / scale).round().clamp(-127, 127) * scale)


FORMATS = {"fp32 (no rounding)": (None, None), "e4m3 keys and values (0830)": (e4m3, e4m3),
           "int8 keys and values": (int8, int8), "e4m3 values, bf16 keys": (bf16, e4m3),
           "e4m3 keys, bf16 values": (e4m3, bf16)}
current = [bf16, bf16]


def attention(module, query, key, value, mask, **kw):
    k = current[0](key) if current[0] else key
    v = current[1](value) if current[1] else value
    return sdpa_attention_forward(module, query, k, v, mask, **kw)


AttentionInterface.register("pb_kv_formats", attention)
model_dir = sys.argv[1]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="pb_kv_formats")


def logprobs() -> list[float]:
    out = []
    with torch.inference_mode():
        for messages, reply in reference_texts():
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"]
            target = tok(reply, add_special_tokens=False)["input_ids"]
            ids = torch.tensor([prompt + target])
            lp = model(ids).logits[0, len(prompt) - 1:-1].float().log_softmax(-1)
            out += lp.gather(-1, torch.tensor(target)[:, None])[:, 0].tolist()
    return out


reference = logprobs()
rows = {}
for name, pair in FORMATS.items():
    current[:] = pair
    deltas = [abs(a - b) for a, b in zip(reference, logprobs())]
    rows[name] = {"tokens": len(deltas), "mean_abs": round(sum(deltas) / len(deltas), 4), "max_abs": round(max(deltas), 3)}
    print(name, rows[name], flush=True)
print(json.dumps(rows))

"""Run by tests/test_fp8_weights.py in a fresh interpreter with the patched engine first on
PYTHONPATH and PB_FP8_WEIGHTS set or not: loads an FP8 checkpoint through the model-load hooks
(as a server does) and its dequantized twin plainly, and compares their logits on three
passages of library source, teacher-forced.

Run as one rank of a torch.distributed launch (WORLD_SIZE > 1), both models are split with the
engine's TP plan. Prints one JSON line: the dtype the FP8 checkpoint's linear and expert weights load in, whether
each passage's logits equal the twin's bit for bit (and the largest difference), or the load
error upstream raised."""

import inspect
import json
import logging
import os
import sys
import textwrap

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers._pb import load
from transformers._pb.ops import fused_moe, invariant_gemm

# FP8_DIR may be `convert:DIR`: DIR's plain checkpoint quantized in memory; the "twin" then is
# the FP8 checkpoint of it, loaded (the two must agree)
fp8_dir, twin_dir = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(twin_dir)
passages = [textwrap.dedent(inspect.getsource(f))[:600] for f in (json.dumps, textwrap.wrap, inspect.getsource)]

# products that read float8 weights in the series' kernels (0380's GEMM, 0220's experts)
calls = {"gemm_fp8": 0, "moe_fp8": 0}
gemm_fp8, experts_forward = invariant_gemm.gemm_fp8, fused_moe.experts_forward


def counting_gemm(*args, **kwargs):
    out = gemm_fp8(*args, **kwargs)
    calls["gemm_fp8"] += out is not None
    return out


def counting_experts(self, *args):
    calls["moe_fp8"] += getattr(self, "pb_fp8", None) is not None
    return experts_forward(self, *args)


invariant_gemm.gemm_fp8, fused_moe.experts_forward = counting_gemm, counting_experts
report = []  # what upstream's loader logs (its load report names each refused weight's reason)
handler = logging.Handler()
handler.emit = lambda record: report.append(record.getMessage())
logging.getLogger("transformers").addHandler(handler)
split = {}
if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # one rank of a tensor-parallel pair: both models split
    from transformers.distributed import DistributedConfig

    split = {"distributed_config": DistributedConfig(tp_size=int(os.environ["WORLD_SIZE"]))}
kwargs = load.before(dict(split))
try:
    model = AutoModelForCausalLM.from_pretrained(fp8_dir.removeprefix("convert:"), attn_implementation="sdpa",
                                                 **kwargs).eval()
    if fp8_dir.startswith("convert:"):  # a plain checkpoint quantized in memory (patchbay.runtime.fp8)
        from patchbay.runtime import fp8

        fp8.convert_model(model)
except Exception as error:  # upstream's load-time dequantization refuses ragged blocks
    print(json.dumps({"load_error": f"{type(error).__name__}: {error}", "report": "\n".join(report)}))
    sys.exit(0)
load.after(model)
twin = AutoModelForCausalLM.from_pretrained(twin_dir, attn_implementation="sdpa", **kwargs).eval()
layer = model.model.layers[-1]
out = {"rank": int(os.environ.get("RANK", "0")), "linear_dtype": str(layer.self_attn.q_proj.weight.dtype),
       "experts_dtype": str(layer.mlp.experts.down_proj.dtype),
       "experts_class": type(layer.mlp.experts).__name__, "equal": [], "max_abs": 0.0}
with torch.no_grad():
    for text in passages:
        ids = tok(text, return_tensors="pt").input_ids
        a, b = model(ids).logits, twin(ids).logits
        out["equal"].append(torch.equal(a, b))
        out["max_abs"] = max(out["max_abs"], (a - b).abs().max().item())
        out["max_logit"] = max(out.get("max_logit", 0.0), b.abs().max().item())
out["kernel_calls"] = calls
# 0310 with 0810: attentions and MLPs whose FP8 layers were stacked as one float8 weight
out["fp8_stacked"] = sum((getattr(m, name, None) or (None,) * 5)[4] is not None
                         for m in model.modules() for name in ("pb_qkv", "pb_gate_up"))
print(json.dumps(out))

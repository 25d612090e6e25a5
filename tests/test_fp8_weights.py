"""FP8 checkpoints in the release format (patchbay.runtime.fp8) and 0810 PB_FP8_WEIGHTS, which serves
them with their weights kept in FP8: the model computes what its dequantized twin computes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from .conftest import ALL_ON, INTERPRETER_ENV, LOCAL, Server, engine_code, engine_job, engine_module, free_port
from patchbay.runtime import fp8

E4M3_TINY = 2.0 ** -9  # e4m3's smallest subnormal


def test_quantize_covers_ragged_blocks_and_bounds_the_error():
    """A 300 x 200 weight (2.34 x 1.56 blocks) gets a 3 x 2 scale grid; each element comes back
    within e4m3's half-step of its value, relative to its block's scale; an all-zero block has
    scale 1."""
    torch.manual_seed(0)
    w = torch.randn(300, 200) * torch.logspace(-3, 1, 300)[:, None]
    w[256:, 128:] = 0
    q, scale = fp8.quantize(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and scale.shape == (3, 2)
    assert scale[2, 1] == 1
    back = fp8.dequantize(q, scale, torch.float32)
    s = scale.repeat_interleave(128, 0)[:300].repeat_interleave(128, 1)[:, :200]
    assert ((back - w).abs() <= torch.maximum(w.abs() / 16, s * E4M3_TINY) + 1e-12).all()
    # every block uses e4m3's range: its largest magnitude maps to 448
    assert fp8.quantize(torch.full((128, 128), -3.0))[0].float().min() == -448


@pytest.fixture(scope="module")
def trained_fp8(trained_model, tmp_path_factory):
    """synthetic:trained-fp8 (synthetic:trained quantized) and its dequantized twin."""
    out = tmp_path_factory.mktemp("fp8")
    q = fp8.write_fp8(trained_model, out / "trained-fp8", "synthetic:trained-fp8")
    return str(q), str(fp8.write_dequantized(q, out / "twin"))


@pytest.fixture(scope="module")
def ragged_fp8(tmp_path_factory):
    """A small glm4_moe whose dense MLP is 2.5 blocks wide (as GLM-4.5-Air's 10,944 is 85.5), in FP8
    and dequantized."""
    from transformers import Glm4MoeForCausalLM

    from patchbay.runtime import synth

    out = tmp_path_factory.mktemp("ragged")
    config = synth.tiny_config(synth.VOCAB_SIZE)
    config.update(dict(hidden_size=256, num_attention_heads=4, head_dim=64, intermediate_size=320,
                       moe_intermediate_size=128))
    torch.manual_seed(1)
    model = Glm4MoeForCausalLM(config).eval()
    synth.save_checkpoint(model, synth.padded_tokenizer(synth.VOCAB_SIZE), out / "bf16")
    q = fp8.write_fp8(out / "bf16", out / "fp8", "ragged-fp8")
    return str(q), str(fp8.write_dequantized(q, out / "twin"))


def test_checkpoint_is_in_the_release_format(trained_fp8, trained_model):
    """Every decoder linear and each expert's three projections are e4m3 with a float32 scale per
    128 x 128 block; embeddings, head, norms and the router keep their dtype and values."""
    q_dir, _ = trained_fp8
    config = json.loads(open(f"{q_dir}/config.json").read())
    assert config["quantization_config"] == {"activation_scheme": "dynamic", "fmt": "e4m3",
                                             "quant_method": "fp8", "weight_block_size": [128, 128]}
    with safe_open(f"{q_dir}/model.safetensors", "pt") as f, \
            safe_open(f"{trained_model}/model.safetensors", "pt") as src:
        keys = set(f.keys())
        quantized = {k for k in keys if f.get_slice(k).get_dtype() == "F8_E4M3"}
        assert "model.layers.3.mlp.experts.2.down_proj.weight" in quantized
        assert "model.layers.0.mlp.gate_proj.weight" in quantized and "model.layers.1.self_attn.k_proj.weight" in quantized
        assert {k.removesuffix("weight") + "weight_scale_inv" for k in quantized} <= keys
        # k_proj: 2 heads x 32 = 64 rows, half a block
        assert f.get_tensor("model.layers.1.self_attn.k_proj.weight_scale_inv").shape == (1, 2)
        for key in ("model.embed_tokens.weight", "lm_head.weight", "model.layers.1.mlp.gate.weight",
                    "model.layers.1.input_layernorm.weight", "model.layers.1.self_attn.k_proj.bias"):
            assert key not in quantized and torch.equal(f.get_tensor(key), src.get_tensor(key)), key
        assert len(quantized) == sum(1 for k in src.keys() if fp8.QUANTIZED.match(k))


def test_engine_expansion_matches_the_writer_and_reads_a_shard_by_its_global_index(patched_engine):
    """The engine's expansion gives the writer's values, and a shard that starts inside a block (rows
    224-447 of 3.5 blocks; columns 160-319) or is two pieces (a fused gate/up shard) reads the
    whole scale grid at the model-wide indices it is given."""
    ops = engine_module(patched_engine, "ops.fp8_weights")
    torch.manual_seed(2)
    q, scale = fp8.quantize(torch.randn(448, 320))
    full = fp8.dequantize(q, scale, torch.bfloat16)
    assert torch.equal(ops.dequantize(q, scale, (128, 128), torch.bfloat16), full)
    everything = torch.arange(320)
    part = ops.dequantize(q[224:448], scale, (128, 128), torch.bfloat16, (torch.arange(224, 448), everything))
    assert torch.equal(part, full[224:448])
    part = ops.dequantize(q[:, 160:], scale, (128, 128), torch.bfloat16, (torch.arange(448), torch.arange(160, 320)))
    assert torch.equal(part, full[:, 160:])
    rows = torch.cat([torch.arange(0, 112), torch.arange(224, 336)])
    assert torch.equal(ops.dequantize(q[rows], scale, (128, 128), torch.bfloat16, (rows, everything)), full[rows])
    with pytest.raises(ValueError, match="needs scales"):
        ops.dequantize(q[224:448], scale[:2], (128, 128), torch.bfloat16, (torch.arange(224, 448), everything))


def test_knob_serves_the_checkpoint_in_fp8_as_its_dequantized_twin(patched_engine, trained_fp8):
    """With the knob, the weights load as e4m3 and the logits equal the twin's bit for bit (0310's
    stacked FP8 layers, where no kernel runs their product, run one by one); without it, upstream
    dequantizes at load on a CPU, to the same logits."""
    on = engine_job("fp8_job.py", patched_engine, *trained_fp8, PB_FP8_WEIGHTS="1", PB_FUSED_PROJ="1",
                    **INTERPRETER_ENV)
    assert on["linear_dtype"] == "torch.float8_e4m3fn" and on["experts_dtype"] == "torch.float8_e4m3fn", on
    assert on["equal"] == [True, True, True] and on["fp8_stacked"] == 8, on
    off = engine_job("fp8_job.py", patched_engine, *trained_fp8, **INTERPRETER_ENV)
    assert off["linear_dtype"] == "torch.float32" and off["equal"] == [True, True, True], off


def test_knob_loads_ragged_blocks_upstream_refuses(patched_engine, ragged_fp8):
    """A dense MLP 2.5 blocks wide: upstream's load-time dequantization refuses it; the knob serves it
    as its twin."""
    off = engine_job("fp8_job.py", patched_engine, *ragged_fp8, **INTERPRETER_ENV)
    assert "conversion of the weights" in off.get("load_error", ""), off
    assert "Weight shape (320, 256) not divisible by scale grid (3, 2)" in off["report"], off
    on = engine_job("fp8_job.py", patched_engine, *ragged_fp8, PB_FP8_WEIGHTS="1", **INTERPRETER_ENV)
    assert on["linear_dtype"] == "torch.float8_e4m3fn" and on["equal"] == [True, True, True], on


def _replies(server) -> list[str]:
    """Greedy and seeded sampled chat replies to three requests, one at a time."""
    import httpx

    out = []
    prompts = ("def wrap(text, width):\n    lines = []\n", "class Queue:\n    def __init__(self, maxsize=0):\n",
               "import os\n\ndef walk(top):\n")
    for prompt, extra in zip(prompts, ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 7},
                                       {"temperature": 0})):
        body = {"messages": [{"role": "user", "content": prompt}],
                "max_tokens": 32, "ignore_eos": True, **extra}
        r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        out.append(r.json()["choices"][0]["message"]["content"])
    return out


def test_served_with_the_local_set_as_its_twin(patched_engine, tmp_path):
    """MODEL=synthetic:trained-fp8 is written on first use; served with the local knob set and
    PB_FP8_WEIGHTS (0220's experts name included), its greedy and seeded replies are the twin's."""
    import dataclasses

    from patchbay.runtime.models import model_path

    q_dir = model_path(dataclasses.replace(LOCAL, model="synthetic:trained-fp8"))
    assert json.loads(open(f"{q_dir}/patchbay-synth.json").read())["model"] == "synthetic:trained-fp8"
    twin = str(fp8.write_dequantized(q_dir, tmp_path / "twin"))
    replies = []
    for model, knobs in ((q_dir, {**ALL_ON, "PB_FP8_WEIGHTS": "1"}), (twin, ALL_ON)):
        server = Server(patched_engine, model, knobs, tmp_path / f"run-{len(replies)}")
        try:
            replies.append(_replies(server))
        finally:
            server.stop()
    assert replies[0] == replies[1] and len(set(replies[0])) == 3, replies


def _tp_job(engine, fp8_dir: str, twin_dir: str, **env: str) -> list[dict]:
    """fp8_job.py as two gloo ranks on this machine: each rank's JSON line."""
    import subprocess
    import sys
    from pathlib import Path

    from patchbay.runtime import procenv

    from .conftest import engine_environ

    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(Path(__file__).with_name("fp8_job.py")), fp8_dir, twin_dir],
                              env={**engine_environ(engine, **env), **procenv.rank(r, 2, "127.0.0.1", port)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_tp2_shards_scales_with_their_rows(patched_engine, trained_fp8):
    """Two ranks split every product; k_proj's 64 rows (half a 128-row block) give each rank 32 rows
    of one block. Each rank's FP8 logits equal the twin's split the same way, bit for bit."""
    ranks = _tp_job(patched_engine, *trained_fp8, PB_FP8_WEIGHTS="1", **INTERPRETER_ENV)
    for out in ranks:
        assert out["linear_dtype"] == "torch.float8_e4m3fn" and out["equal"] == [True, True, True], ranks


KERNELS = {"TRITON_INTERPRET": "1", "PB_INVARIANT_GEMM": "1", "PB_FUSED_MOE": "1"}

GEMM_CODE = """
import json, torch
from transformers._pb.ops import fp8_weights, invariant_gemm
invariant_gemm.at_load()  # the knob is on in this process's environment
torch.manual_seed(3)
out = {}
# a 200 x 4,800 float8 weight (K in chunks: 0380's decode path sums them apart); a shard of its
# rows 64-263 of a 300-row matrix and columns 96-4,895 of 5,000, both starting inside a block
grid = torch.rand(3, 40) + 0.5
q = (torch.randn(300, 5000) * 100).to(torch.float8_e4m3fn)
rows, cols = torch.arange(64, 264), torch.arange(96, 4896)
shard = q[64:264, 96:4896]
expanded = fp8_weights.dequantize(shard, grid, (128, 128), torch.float32, (rows, cols))
a = torch.randn(300, 4800)
bias = torch.randn(200)
alone = invariant_gemm.gemm_fp8(a[:1], shard, grid, (rows // 128).int(), 96, 128, bias)
for m in (1, 5, 300):
    fp8 = invariant_gemm.gemm_fp8(a[:m], shard, grid, (rows // 128).int(), 96, 128, bias)
    twin = invariant_gemm.gemm(a[:m], expanded.t(), bias)
    out[m] = {"alone": torch.equal(fp8[:1], alone), "twin": torch.equal(fp8, twin),
              "error": ((fp8 - twin).abs().max() / twin.abs().max()).item()}
print(json.dumps(out))
"""


def test_gemm_expands_fp8_tiles_to_the_expanded_weights_sums(patched_engine):
    """0810's GEMM reading a float8 shard that starts mid-block, at 1, 5 and 300 rows (chunked K,
    one program a chunk or a tile): the first row's bits are its bits alone, and every row is the
    GEMM on the expanded weight to float32 rounding."""
    proc = engine_code(GEMM_CODE, patched_engine, timeout=900, PB_INVARIANT_GEMM="1", TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(r["alone"] for r in out.values()), out
    assert all(r["error"] < 1e-5 for r in out.values()), out


STEP_SCALE_CODE = """
import json, os, sys, torch
from transformers._pb import knobs
from transformers._pb.ops import common, fp8_weights, fused_moe, invariant_gemm
invariant_gemm.at_load()  # the knob is on in this process's environment
knobs.load()
torch.manual_seed(4)
out = {}
# every e4m3 value but NaN, subnormals and both zeros included, in a 256 x 1,024 weight of 2 x 8 blocks
codes = torch.arange(256, dtype=torch.int32)
codes = codes[(codes & 0x7F) != 0x7F].to(torch.uint8)
q = codes[torch.randint(0, len(codes), (256, 1024))].view(torch.float8_e4m3fn)
grid = torch.rand(2, 8) * 3 + 0.01
rows = torch.arange(256)
exact = fp8_weights.dequantize(q, grid, (128, 128), torch.float64, (rows, torch.arange(1024)))
x = torch.randn(300, 1024)
products = {}
for on in (False, True):
    common.FP8_STEP_SCALE = on
    alone = invariant_gemm.gemm_fp8(x[:1], q, grid, (rows // 128).int(), 0, 128)
    row = {}
    for m in (1, 7, 300):
        got = invariant_gemm.gemm_fp8(x[:m], q, grid, (rows // 128).int(), 0, 128).double()
        want = x[:m].double() @ exact.t()
        size = x[:m].double().abs() @ exact.abs().t() + 1
        row[m] = {"alone": torch.equal(got[:1].float(), alone), "error": ((got - want).abs() / size).max().item()}
    products[on] = got
    out["on" if on else "off"] = row
out["bits_differ"] = not torch.equal(products[False], products[True])  # the knob takes the other path
# the knob's bound: a model whose scales reach 2 ** 7 keeps 0810's expansion
class Holder(torch.nn.Module):
    def __init__(self, top):
        super().__init__()
        grid = torch.full((2, 2), 0.5).index_fill_(0, torch.tensor([1]), top)
        self.weight_scale_inv = torch.nn.Parameter(grid, requires_grad=False)
checks = {}
for top in (1.0, 127.5, 128.0, float("inf")):
    fp8_weights._check_step_scale(Holder(top))
    checks[str(top)] = common.FP8_STEP_SCALE
out["in_force"] = checks
fp8_weights.restore()
out["restored"] = common.FP8_STEP_SCALE
print(json.dumps(out))
"""


def test_step_scale_sums_the_unscaled_weight_and_keeps_a_rows_bits(patched_engine):
    """0960: the float8 GEMM with each step's sum scaled (float32 activations under the interpreter,
    every e4m3 value but NaN in the weight: subnormals, both zeros) stays within float32 rounding
    of the product with the exact dequantized weight, as 0810's expansion does, and gives a row the
    same bits alone and among 7 or 300 rows; the knob is in force only where every scale is below
    2 ** 7."""
    proc = engine_code(STEP_SCALE_CODE, patched_engine, timeout=900, PB_INVARIANT_GEMM="1", PB_FP8_WEIGHTS="1",
                       PB_FP8_STEP_SCALE="1", TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for mode in ("off", "on"):
        assert all(r["alone"] and r["error"] < 1e-6 for r in out[mode].values()), (mode, out[mode])
    assert out["bits_differ"] is True
    assert out["in_force"] == {"1.0": True, "127.5": True, "128.0": False, "inf": False}, out["in_force"]
    assert out["restored"] is False


def test_kernels_expand_fp8_tiles_to_the_twins_sums(patched_engine, trained_fp8):
    """With 0380's GEMM and 0220's experts kernels (under Triton's interpreter), the FP8 model reads
    float8 tiles in 0810's kernels, and its logits are the twin's under the bf16 kernels to the
    rounding of sums taken in another order (the transposed tiles). As in production, 0310 stacks
    each attention's q/k/v and each MLP's gate/up (4 + 4 here) into one float8 GEMM: k_proj's 64
    rows, half a block, read the scale row after q_proj's two."""
    on = engine_job("fp8_job.py", patched_engine, *trained_fp8, timeout=1800, PB_FP8_WEIGHTS="1",
                    PB_FUSED_PROJ="1", **KERNELS)
    assert on["linear_dtype"] == "torch.float8_e4m3fn" and on["max_abs"] <= 1e-4 * on["max_logit"], on
    assert on["kernel_calls"]["gemm_fp8"] > 0 and on["kernel_calls"]["moe_fp8"] > 0, on
    assert on["fp8_stacked"] == 8, on


def test_quantized_in_memory_is_the_checkpoint_loaded(patched_engine, trained_model, trained_fp8):
    """convert_model (how the GPU tools make air12-fp8 without files) gives the model loading the FP8
    checkpoint gives: the same float8 weights and scales, the same logits."""
    out = engine_job("fp8_job.py", patched_engine, f"convert:{trained_model}", trained_fp8[0], PB_FP8_WEIGHTS="1",
                     **INTERPRETER_ENV)
    assert out["linear_dtype"] == "torch.float8_e4m3fn" and out["experts_class"] == "FP8Experts", out
    assert out["equal"] == [True, True, True], out


BUILD_CODE = """
import json, torch
from transformers._pb import load
from patchbay.runtime import fp8, synth
config = synth.tiny_config(synth.VOCAB_SIZE)
config.update(dict(hidden_size=256, num_attention_heads=4, head_dim=64, intermediate_size=320,
                   moe_intermediate_size=128, num_hidden_layers=3))
load.before({})
models = [fp8.build_air_fp8("cpu", seed, config) for seed in (0, 0, 1)]
for m in models:
    load.after(m)
states = [m.state_dict() for m in models]
same = lambda a, b: all(torch.equal(a[k].view(torch.uint8) if a[k].dtype == torch.float8_e4m3fn else a[k],
                                    b[k].view(torch.uint8) if b[k].dtype == torch.float8_e4m3fn else b[k]) for k in a)
ids = torch.arange(5, 45)[None]
with torch.no_grad():
    logits = models[0](ids).logits
print(json.dumps({"layers": len(models[0].model.layers), "keys": sorted(states[0]) == sorted(states[1]),
                  "same_seed": same(states[0], states[1]), "other_seed": same(states[0], states[2]),
                  "fp8": sorted({str(v.dtype) for k, v in states[0].items() if k.endswith("proj.weight") or k.endswith("_proj")}),
                  "finite": bool(torch.isfinite(logits).all()), "spread": float(logits.std())}))
"""


def test_air_fp8_is_built_a_layer_at_a_time_from_its_seed(patched_engine):
    """build_air_fp8 (full-size Air in FP8 on one GPU) at a small shape: three layers, every linear
    and expert stack float8, the same seed the same weights, another seed others, and a forward
    through them with the knob gives finite, varied logits."""
    proc = engine_code(BUILD_CODE, patched_engine, timeout=600, PB_FP8_WEIGHTS="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["layers"] == 3 and out["keys"] and out["same_seed"] and not out["other_seed"], out
    assert out["fp8"] == ["torch.float8_e4m3fn"] and out["finite"] and out["spread"] > 0, out

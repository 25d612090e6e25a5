"""Run by tests/test_decode_path.py in a fresh interpreter with the patched engine first on
PYTHONPATH and the PB_* variables the test sets: the decode-path hooks of 0230, 0240, 0250 and
0270 called through upstream's own functions (0270 through the tiny model's own batching),
with the knob values of this process. Prints one JSON line."""

import json
import sys
from types import SimpleNamespace

import torch
from transformers import AutoConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.initialization import (
    decide_use_async_batching,
    resolve_continuous_batching_config,
)
from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingIOs
from transformers.generation.continuous_batching.model_runner import ModelRunner


def padding() -> dict:
    """ModelRunner.maybe_pad_inputs, as upstream calls it, for a few varlen steps."""
    runner = SimpleNamespace(pad_inputs=True,
                             cache=SimpleNamespace(max_batch_tokens=4096, max_tokens_read=200_000),
                             cb_config=SimpleNamespace(q_padding_interval_size=64, kv_padding_interval_size=16384,
                                                       max_requests_per_batch=32))
    steps = [(1, 0), (1, 300), (3, 900), (32, 6000), (100, 0), (5000, 70_000), (1, 250_000)]
    return {f"{q},{kv}": list(ModelRunner.maybe_pad_inputs(runner, q, kv, False)) for q, kv in steps}


def io(q: int, kv: int, fill: float, cu_q=(0,), cu_k=(0,)) -> SimpleNamespace:
    """The fields _transfer_inputs reads or writes, as CPU tensors (the GPU's are the same shapes)."""
    bulk = torch.full((6, 16), fill)
    bulk[2, : len(cu_q)] = torch.tensor(cu_q, dtype=bulk.dtype)
    bulk[4, : len(cu_k)] = torch.tensor(cu_k, dtype=bulk.dtype)
    return SimpleNamespace(
        num_q_tokens=q, max_kv_read=kv, num_request_in_batch=len(cu_q) - 1, true_read_sizes=[kv],
        true_write_sizes=[q], use_block_table=False, total_seqlen_q=q, total_seqlen_k={"full_attention": q + kv},
        max_length_q=q, max_length_k={"full_attention": q + kv}, _bulk_input_tensor=bulk,
        cumulative_seqlens_q=bulk[2], cumulative_seqlens_k={"full_attention": bulk[4]},
        config=SimpleNamespace(sliding_window=None), block_table=torch.full((1, 4), fill),
        write_index_storage=torch.full((1, 16), fill), read_index_storage=torch.full((1, 64), fill),
        attention_mask={"full_attention": torch.full((1, 1, 16, 64), fill)})


def transfer() -> dict:
    """A step of two sequences (3 new tokens after 13 cached, and 1 after 5): 4 query tokens
    padded to 8, 18 keys read padded to 24. The host builds its mask as upstream does; after the
    transfer the device's region must hold the same mask, whichever way it got there."""
    from transformers.generation.continuous_batching.utils import build_attention_mask

    cu_q, cu_k = [0, 3, 4], [0, 16, 22]
    host, device = io(8, 24, 1.0, cu_q, cu_k), io(0, 0, 0.0)
    host_mask = host.attention_mask["full_attention"]
    host_mask.fill_(torch.finfo(host_mask.dtype).min)
    build_attention_mask(host_mask, cu_q, cu_k)
    ContinuousBatchingIOs._transfer_inputs(host, device, stream=None, non_blocking=False)
    region = device.attention_mask["full_attention"][..., :8, :32]
    return {"bulk_equal": bool(torch.equal(device._bulk_input_tensor, host._bulk_input_tensor)),
            "write_index": device.write_index_storage.sum().item(),
            "read_index": device.read_index_storage.sum().item(),
            "mask_region_equal": bool(torch.equal(region, host_mask[..., :8, :32])),
            "mask_outside_region_untouched": bool((device.attention_mask["full_attention"][..., 8:, :] == 0).all()
                                                  and (device.attention_mask["full_attention"][..., :, 32:] == 0).all()),
            "host_builds_mask_next": not getattr(host, "_pb_mask_on_device", False)}


def mask_cases(count: int = 300) -> tuple[int, list]:
    """0240's device-side mask builder against upstream's, on random steps (on the CPU here)."""
    import random

    from transformers._pb.runtime.async_io import build_mask
    from transformers.generation.continuous_batching.utils import build_attention_mask

    rng = random.Random(0)
    mismatches = []
    for case in range(count):
        qs = [rng.choice([0, 1, 1, rng.randint(1, 9)]) for _ in range(rng.randint(0, 6))]
        ks = [q + rng.choice([0, 0, rng.randint(1, 20)]) for q in qs]
        cu_q, cu_k = [0], [0]
        for q, k in zip(qs, ks):
            cu_q.append(cu_q[-1] + q)
            cu_k.append(cu_k[-1] + k)
        rows, cols = cu_q[-1] + rng.randint(0, 5), cu_k[-1] + rng.randint(0, 7)
        window = rng.choice([1, 1, 3, 6])
        dtype = rng.choice([torch.float32, torch.bfloat16])
        expected = torch.full((1, 1, rows, cols), torch.finfo(dtype).min, dtype=dtype)
        build_attention_mask(expected, cu_q, cu_k, window)
        got = torch.full((1, 1, rows, cols), 7.0, dtype=dtype)
        build_mask(got, torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32), window)
        if not torch.equal(got, expected):
            mismatches.append({"case": case, "cu_q": cu_q, "cu_k": cu_k, "shape": [rows, cols], "window": window})
    return count, mismatches[:3]


def async_choice(graphs: bool) -> bool | None:
    cfg = SimpleNamespace(use_async_batching=None, cuda_graph_booleans=(graphs, graphs))
    decide_use_async_batching(cfg, is_attn_mask_needed=True)
    return cfg.use_async_batching


def compile_levels(model_dir: str) -> list:
    """The compile level upstream resolves for a config that leaves it unset, and for one that sets 2."""
    config = AutoConfig.from_pretrained(model_dir)
    levels = []
    for asked in (0, 2):
        cb = ContinuousBatchingConfig(num_blocks=8, max_batch_tokens=64, default_compile_level=asked)
        resolved = resolve_continuous_batching_config(config, cb, None, False, torch.device("cpu"))
        mode = resolved.varlen_compile_config.mode if resolved.varlen_compile_config else None
        levels.append([resolved.default_compile_level, mode])
    return levels


def causal_prefill(model_dir: str) -> dict:
    """Greedy replies of the tiny model through continuous batching, each prompt alone and the
    three together, with every sdpa call recorded: whether it had a mask or ran causal."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, *args, is_causal=False, **kwargs):
        calls.append({"q": query.shape[-2], "k": key.shape[-2], "mask": attn_mask is not None,
                      "causal": bool(is_causal)})
        return sdpa(query, key, value, attn_mask, *args, is_causal=is_causal, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = recording
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    prompts = [tok(t)["input_ids"] for t in ("def fibonacci(n):", "The quick brown fox jumps", "import os\nimport")]
    greedy = GenerationConfig(do_sample=False, max_new_tokens=12, eos_token_id=-1, pad_token_id=0)
    cache = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=256)

    def run(batch):
        out = model.generate_batch(inputs=batch, generation_config=greedy, continuous_batching_config=cache,
                                   progress_bar=False)
        return [list(out[k].generated_tokens) for k in sorted(out, key=lambda k: int(str(k).rsplit("_", 1)[-1]))]

    report = {"alone": [], "alone_calls": []}
    for prompt in prompts:
        calls.clear()
        report["alone"].append(run([prompt])[0])
        report["alone_calls"].append([dict(c) for c in calls if c["q"] > 1])
    calls.clear()
    report["together"] = run(prompts)
    report["together_calls"] = [dict(c) for c in calls if c["q"] > 1]
    # As while a CUDA graph is captured: the model's mask builder cannot look for packed sequences
    # on the host then, so it builds an explicit mask even when given none (the H200 path, W08).
    from transformers.utils import import_utils

    capturing = import_utils.is_cuda_stream_capturing
    import_utils.is_cuda_stream_capturing = lambda: True
    try:
        calls.clear()
        report["capturing"] = run([prompts[0]])[0]
        report["capturing_calls"] = [dict(c) for c in calls if c["q"] > 1]
    finally:
        import_utils.is_cuda_stream_capturing = capturing
    report["layers"] = model.config.num_hidden_layers
    torch.nn.functional.scaled_dot_product_attention = sdpa
    from transformers._pb.runtime import causal_prefill as marks

    report["steps"] = dict(marks.STEPS)  # how 0270 marked each step (empty with the knob off)
    return report


cases, mismatches = mask_cases()
print(json.dumps({"compile_levels": compile_levels(sys.argv[1]), "mask_cases": cases, "mask_mismatches": mismatches,
                  "padding": padding(), "transfer": transfer(), "async_with_graphs": async_choice(True),
                  "async_without_graphs": async_choice(False), "switch_interval": sys.getswitchinterval(),
                  "causal_prefill": causal_prefill(sys.argv[1]) if "--replies" in sys.argv else None}))

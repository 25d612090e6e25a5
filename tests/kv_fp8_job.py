"""Run by tests/test_kv_fp8.py under Triton's CPU interpreter (TRITON_INTERPRET=1) with the patched
engine first on PYTHONPATH, PB_VARLEN_ATTENTION, PB_VARLEN_FAST, PB_SPLIT_DECODE and PB_CACHE_READ
on, and PB_KV_FP8 or PB_KV_INT8 (0840): the cache's 8-bit rows and scales, and the tiny model's
batching loop with the cache in that format,
its attention read three ways (upstream's gather dequantized then sdpa, the gather then 0370's
kernels, and 0750's kernels reading the e4m3 rows themselves). Prints one JSON line."""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from transformers._pb.ops import kv_fp8, varlen_attention


def rows() -> dict:
    """quantize / dequantize on states of mixed magnitudes, a head of zeros among them, and the
    row layout's sizes."""
    gen = torch.Generator().manual_seed(3)
    states = torch.randn((64, 2, 16), generator=gen) * torch.logspace(-4, 3, 64)[:, None, None]
    states[5, 1] = 0.0
    q, s = kv_fp8.quantize(states)
    back = kv_fp8.dequantize(q, s, torch.float32)
    amax = states.abs().amax(-1, keepdim=True)
    relative = ((back - states).abs() / torch.where(amax > 0, amax, 1.0)).max().item()
    cache = torch.zeros(10 * kv_fp8.row_bytes(2, 16), dtype=torch.uint8)
    data, scales = kv_fp8.views(cache, 10, 2, 16)
    index = torch.tensor([7, 2, 9])
    kv_fp8.write(data, scales, index, states[:3])
    read = kv_fp8.read(data, scales, index, torch.float32)
    return {"relative_error": relative, "zero_head_zero": bool((back[5, 1] == 0).all()),
            "head_max": (lambda m: [m.min().item(), m.max().item()])(
                q.view(kv_fp8.element()).float().abs().amax(-1)[amax[..., 0] > 0]),
            "element": str(kv_fp8.element()).removeprefix("torch."),
            "scales_powers_of_two": bool((torch.frexp(s)[0] == 0.5).all()),
            "read_is_round_trip": bool(torch.equal(read, back[:3])),
            "untouched_rows_zero": bool((cache.view(10, -1)[[0, 1, 3, 4, 5, 6, 8]] == 0).all()),
            "row_bytes_air": kv_fp8.row_bytes(8, 128), "row_bytes_air_tp2": kv_fp8.row_bytes(4, 128),
            "row_bytes_tiny": kv_fp8.row_bytes(2, 16)}


def batching_loop(model_dir: str) -> dict:
    """The tiny model's greedy replies to prompts of 400, 150 and 20 tokens, steps of at most 256
    tokens (the long prompt in chunks after its cached keys, beside decode rows), the cache in
    e4m3: attention through the gather and through the pages give the same bits; each prompt
    alone gets the reply it got among the others."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    words = "the cache holds every key a request has read so far and the step reads them again ".split()
    prompts = [tok(" ".join(words[i % len(words)] for i in range(n)))["input_ids"][:n] for n in (400, 150, 20)]
    config = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    real, real_write = varlen_attention._attend, kv_fp8.write_both
    outputs, fp8_calls, writes = [], [], []

    def recording(*args, **kwargs):
        out = real(*args, **kwargs)
        cu_q = args[4].tolist()  # the rows of sequences of more than one query token: prompt rows
        prompt = torch.zeros(out.shape[1], dtype=torch.bool)
        for a, b in zip(cu_q, cu_q[1:]):
            prompt[a:b] = b - a > 1
        outputs.append((out.clone(), prompt))
        fp8_calls.append(kwargs.get("scales") is not None)
        return out

    def counted_write(*args):
        writes.append(True)
        return real_write(*args)

    def run(prompts, fp8: bool, kernels: bool, read: bool, step_tokens: int = 256) -> dict:
        kv_fp8.ENABLED = fp8
        varlen_attention.ENABLED, varlen_attention.READ_CACHE = kernels, read
        outputs.clear(), fp8_calls.clear(), writes.clear()
        cb = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=step_tokens)
        outs = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb,
                                    progress_bar=False)
        return {"replies": [outs[r].generated_tokens for r in sorted(outs)], "outputs": list(outputs),
                "fp8_calls": sum(fp8_calls), "writes": len(writes)}

    varlen_attention._attend, kv_fp8.write_both = recording, counted_write
    runs = {"bf16": run(prompts, False, True, True), "sdpa": run(prompts, True, False, False),
            "gather": run(prompts, True, True, False), "pages": run(prompts, True, True, True)}
    alone = [run([p], True, True, True)["replies"][0] for p in prompts]
    whole = run(prompts, True, True, True, step_tokens=1024)  # the long prompt in one step, not chunks
    varlen_attention._attend, kv_fp8.write_both = real, real_write
    gather, pages = runs["gather"], runs["pages"]
    return {"prompt_lengths": [len(p) for p in prompts], "reply_lengths": [len(r) for r in pages["replies"]],
            "calls": len(pages["outputs"]), "pages_fp8_calls": pages["fp8_calls"],
            "gather_fp8_calls": gather["fp8_calls"],
            "writes": {name: r["writes"] for name, r in runs.items()},
            "pages_calls_all_fp8": pages["fp8_calls"] == len(pages["outputs"]),
            "same_calls": len(gather["outputs"]) == len(pages["outputs"]),
            "prompt_rows": sum(int(m.sum()) for _, m in pages["outputs"]),
            "decode_rows": sum(int((~m).sum()) for _, m in pages["outputs"]),
            "prompt_rows_equal_bits": all(torch.equal(x[:, m], y[:, m]) for (x, m), (y, _) in
                                          zip(gather["outputs"], pages["outputs"])),
            "decode_rows_max_abs_diff": max((x[:, ~m] - y[:, ~m]).abs().max().item() if (~m).any() else 0.0
                                            for (x, m), (y, _) in zip(gather["outputs"], pages["outputs"])),
            "replies_equal": gather["replies"] == pages["replies"],
            "whole_prompt_replies_equal": whole["replies"] == pages["replies"], "whole_calls": len(whole["outputs"]),
            "sdpa_replies_equal": runs["sdpa"]["replies"] == pages["replies"],
            "alone_equal_batched": alone == pages["replies"],
            "outputs_differ_from_full_precision": any(not torch.equal(x, y) for (x, _), (y, _) in
                                                      zip(runs["bf16"]["outputs"], pages["outputs"])),
            "max_abs_diff_from_full_precision": max((x - y).abs().max().item() for (x, _), (y, _) in
                                                    zip(runs["bf16"]["outputs"], pages["outputs"])),
            "replies_equal_full_precision": runs["bf16"]["replies"] == pages["replies"]}


def cache_sizes(model_dir: str) -> dict:
    """The pool's bytes a block with the knob off and on (the tiny model: 2 KV heads of 16, float32)."""
    from transformers.generation.continuous_batching.cache_allocators.full_attention import (
        FullAttentionCacheAllocator)

    sizes = {}
    for fp8 in (False, True):
        kv_fp8.ENABLED = fp8
        sizes[fp8] = FullAttentionCacheAllocator.get_bytes_per_page(2, 16, torch.float32, 256)
        sizes[f"bf16-{fp8}"] = FullAttentionCacheAllocator.get_bytes_per_page(8, 128, torch.bfloat16, 256)
    return {"page_float32": sizes[False], "page_fp8": sizes[True], "page_bf16_air": sizes["bf16-False"],
            "page_fp8_air": sizes["bf16-True"]}


varlen_attention.at_load()
kv_fp8.at_load()
report = {"enabled": kv_fp8.ENABLED, "format": kv_fp8.FORMAT, "read_cache": varlen_attention.READ_CACHE,
          "fast": varlen_attention.FAST, "rows": rows(), "sizes": cache_sizes(sys.argv[1]),
          "loop": batching_loop(sys.argv[1])}
print(json.dumps(report))

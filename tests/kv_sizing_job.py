"""Run by tests/test_kv_sizing.py with the patched engine first on PYTHONPATH and PB_VARLEN_ATTENTION,
PB_VARLEN_FAST, PB_SPLIT_DECODE, PB_CACHE_READ and PB_KV_SIZING on; under Triton's CPU interpreter
(TRITON_INTERPRET=1) unless the test says not. 0850: whether the model runs without masks, the
pool's sizing with and without the knob at air12's shapes and the H100's free memory, and the tiny
model's batching loop with and without masks. Prints one JSON line."""

import json
import os
import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Glm4MoeConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching import input_outputs, utils
from transformers.generation.continuous_batching.cache import PagedAttentionMemoryHandler
from transformers.generation.continuous_batching.cache_allocators.full_attention import FullAttentionCacheAllocator

from transformers._pb.ops import varlen_attention
from transformers._pb.runtime import kv_sizing


def sizing() -> dict:
    """The memory handler's pages for air12 (12 layers of GLM-4.5-Air's shapes, bfloat16, pages of
    256 tokens, async batching's two IO pairs) from the 25,297 MB a production server on one H100
    found for its pool (W60), knob off and on."""
    config = Glm4MoeConfig(vocab_size=151552, hidden_size=4096, num_hidden_layers=12, num_attention_heads=96,
                           num_key_value_heads=8, head_dim=128, intermediate_size=10944, moe_intermediate_size=1408,
                           n_routed_experts=128, num_experts_per_tok=8, first_k_dense_replace=1)
    config._attn_implementation = "sdpa"
    page = 12 * FullAttentionCacheAllocator.get_bytes_per_page(8, 128, torch.bfloat16, 256)
    out = {}
    for on in (False, True):
        kv_sizing.ENABLED = on
        handler = PagedAttentionMemoryHandler(
            config=config, cb_config=ContinuousBatchingConfig(use_async_batching=True, max_memory_percent=0.9),
            dtype=torch.bfloat16, bytes_per_sector=page, tokens_per_sector=256, bytes_per_block=page,
            attn_types=["full_attention"], model_supports_logits_to_keep=True)
        handler.available_memory = 25297 * 2**20
        tokens, sectors = handler.infer_max_batch_tokens_and_num_sectors()
        out[on] = {"pages": sectors, "max_batch_tokens": tokens, "masks": handler.num_attention_masks,
                   "footprint": handler.compute_memory_footprint(tokens, sectors)}
    return {"off": out[False], "on": out[True], "available": 25297 * 2**20, "page_bytes": page}


def batching_loop(model_dir: str) -> dict:
    """Greedy replies of the tiny model to prompts of 300, 120 and 20 tokens in steps of at most 256
    tokens, knob off and on: the same tokens, masks built only without it."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    words = "a step of the batching loop reads the keys of every sequence it holds and no mask at all ".split()
    prompts = [tok(" ".join(words[i % len(words)] for i in range(n)))["input_ids"][:n] for n in (300, 120, 20)]
    config = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    real_build, real_attend = input_outputs.build_attention_mask, varlen_attention._attend
    builds, attends = [], []

    def counted_build(*args, **kwargs):
        builds.append(True)
        return real_build(*args, **kwargs)

    def counted_attend(*args, **kwargs):
        attends.append(True)
        return real_attend(*args, **kwargs)

    input_outputs.build_attention_mask, varlen_attention._attend = counted_build, counted_attend
    runs = {}
    try:
        for on in (False, True):
            kv_sizing.ENABLED = on
            builds.clear(), attends.clear()
            cb = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=256)
            outs = model.generate_batch(prompts, generation_config=config, continuous_batching_config=cb,
                                        progress_bar=False)
            runs[on] = {"replies": [outs[r].generated_tokens for r in sorted(outs)], "mask_builds": len(builds),
                        "kernel_calls": len(attends), "mask_needed": utils.attn_mask_is_needed(model.config)}
    finally:
        input_outputs.build_attention_mask, varlen_attention._attend = real_build, real_attend
    return {"off": runs[False], "on": runs[True], "prompt_lengths": [len(p) for p in prompts]}


def guard(model_dir: str) -> dict:
    """A paged step reaching sdpa's own path without a mask fails with the knob, not without."""
    config = AutoConfig.from_pretrained(model_dir)
    config._attn_implementation = "sdpa"
    raised = {}
    for on in (False, True):
        kv_sizing.ENABLED = on
        try:
            kv_sizing.no_mask(config)
            raised[on] = None
        except RuntimeError as e:
            raised[on] = str(e)
    return {"off": raised[False], "on": raised[True]}


varlen_attention.at_load()
kv_sizing.at_load()
tiny = AutoConfig.from_pretrained(sys.argv[1])
tiny._attn_implementation = "sdpa"
report = {"enabled": kv_sizing.ENABLED, "why_not": kv_sizing.why_not(tiny)}
if os.environ.get("KV_SIZING_JOB") == "why-not":  # the test's run without a GPU or the interpreter
    print(json.dumps(report))
    sys.exit(0)
report.update(sizing=sizing(), loop=batching_loop(sys.argv[1]), guard=guard(sys.argv[1]))
print(json.dumps(report))

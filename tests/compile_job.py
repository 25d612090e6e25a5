"""Run in a fresh interpreter with an engine first on PYTHONPATH (tests/test_decode_path.py):
the tiny model with 12 layers, greedy through continuous batching, eager and at compile level 1.
Prints JSON: both replies and how often dynamo hit a recompile limit while compiling."""

import json
import sys

import torch
import torch._dynamo.convert_frame as convert_frame
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

hits = []
exceeds = convert_frame.exceeds_recompile_limit


def counting(cache_size, compile_id):
    exceeded, kind = exceeds(cache_size, compile_id)
    if exceeded:
        hits.append(kind)
    return exceeded, kind


convert_frame.exceeds_recompile_limit = counting

config = AutoConfig.from_pretrained(sys.argv[1])
config.num_hidden_layers = 12  # more layers than dynamo's default 8 entries a frame
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
greedy = GenerationConfig(do_sample=False, max_new_tokens=8, eos_token_id=-1, pad_token_id=0)
replies = {}
for level in (0, 1):
    cb = ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=256, default_compile_level=level)
    out = model.generate_batch(inputs=[[5, 6, 7, 8], [9, 10, 11]], generation_config=greedy,
                               continuous_batching_config=cb, progress_bar=False)
    replies[level] = [list(out[k].generated_tokens) for k in sorted(out)]
print(json.dumps({"eager": replies[0], "compiled": replies[1], "limit_hits": hits}))

"""Run by tests/test_decode_path.py in a fresh interpreter with the patched engine first on
PYTHONPATH and the PB_* variables the test sets: the tiny model's greedy replies through
continuous batching (16-token pages, so contexts span several pages and end mid-page), with the
read indices every step wrote into its index storage recorded. 0700 (PB_PAGE_INDICES) must
write upstream's indices, value for value. Prints one JSON line."""

import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingIOs

model_dir = sys.argv[1]
steps = []
prepare = ContinuousBatchingIOs.prepare_batch_tensors


def recording(self, *args, **kwargs):
    prepare(self, *args, **kwargs)
    # true_read_sizes: how many indices each attention group's row holds for this step
    steps.append([self.read_index_storage[i, :n].tolist() for i, n in enumerate(self.true_read_sizes)])


ContinuousBatchingIOs.prepare_batch_tensors = recording
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
texts = ["def fibonacci(n):", "The quick brown fox jumps over the lazy dog " * 5, "import os\nimport sys\n" * 9,
         "A list comprehension builds a list from an iterable in one expression. " * 3]
prompts = [tok(t)["input_ids"] for t in texts]
greedy = GenerationConfig(do_sample=False, max_new_tokens=40, eos_token_id=-1, pad_token_id=0)
cache = ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=64, page_size=16)
out = model.generate_batch(inputs=prompts, generation_config=greedy, continuous_batching_config=cache,
                           progress_bar=False)
replies = [list(out[k].generated_tokens) for k in sorted(out, key=lambda k: int(str(k).rsplit("_", 1)[-1]))]
print(json.dumps({"prompt_tokens": [len(p) for p in prompts], "replies": replies, "steps": steps}))

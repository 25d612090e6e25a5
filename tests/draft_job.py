"""Run by tests/test_drafts.py in a fresh interpreter with the patched engine first on PYTHONPATH
and the PB_* variables the test sets (PB_DRAFT_TOKENS among them, or not): synthetic:trained's
replies to edit prompts (it copies what it has read, so lookup drafts get kept), through
continuous batching:

- greedy, the prompts together and each alone (upstream's batch argmax, no Spec);
- seeded sampled, each request with its own Spec (0630's draws), together and alone;
- a request that extends another's reply (prefix blocks completed while drafting);
- thinking under a budget, then JSON under a grammar: masked rows, greedy and sampled;
- greedy requests of three reply lengths together, so the load falls as they finish (0820's
  limit, and under 0860 the asynchronous loop moving between overlapping and waiting).

DRAFT_JOB_DEVICE=cuda runs the model in bfloat16 on the GPU with asynchronous batching (0240's
two input/output pairs; 0860 drafts inside them), for tests/test_drafts_gpu.py.

It records each reply, how many steps the engine ran, and what drafting steps drafted and kept.
DRAFT_JOB_PHASES (comma-separated) runs only those phases. Prints one JSON line."""

import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
from transformers._pb.runtime import drafts, sampler
from transformers.generation.configuration_utils import ContinuousBatchingConfig
from transformers.generation.continuous_batching.input_outputs import ContinuousBatchingIOs

from patchbay.measure.draft import prompts as edit_prompts
from patchbay.runtime import load_hooks

model_dir, max_new = sys.argv[1], int(sys.argv[2])
device = os.environ.get("DRAFT_JOB_DEVICE", "cpu")
counts = {"steps": 0, "rows": 0, "verify_steps": 0, "drafted": 0, "kept": 0, "held_when_drafting": 0, "waits": 0,
          "passed": 0}
prepare, update, extend, after_step = (ContinuousBatchingIOs.prepare_batch_tensors, drafts.update, drafts.extend,
                                       drafts.after_step)


def counting_prepare(self, *args, **kwargs):
    prepare(self, *args, **kwargs)
    counts["steps"] += 1
    counts["rows"] = max(counts["rows"], self.num_request_in_batch)


def counting_update(processor, future_state, *args):
    offered = len(drafts.drafts_of(future_state.state))
    before = future_state.state.generated_len()
    out = update(processor, future_state, *args)
    if out is not None:
        counts["verify_steps"] += 1
        counts["drafted"] += offered
        counts["kept"] += future_state.state.generated_len() - before - 1
    return out


def counting_extend(scheduler, state, *args):
    drafting = getattr(scheduler, "_pb_drafting", None)
    before = drafting.passed if drafting is not None else 0
    tokens = extend(scheduler, state, *args)
    if drafting is not None:  # 0870: steps a request passed, backing off
        counts["passed"] += drafting.passed - before
    if drafts.drafts_of(state):  # the most requests the scheduler held when one drafted (0820)
        held = len(scheduler.active_requests) + len(scheduler.waiting_requests)
        counts["held_when_drafting"] = max(counts["held_when_drafting"], held)
    return tokens


def counting_after_step(processor):
    drafting = processor.scheduler._pb_drafting
    before = drafting.waits if drafting is not None else 0
    after_step(processor)
    if drafting is not None:
        counts["waits"] += drafting.waits - before


ContinuousBatchingIOs.prepare_batch_tensors = counting_prepare
drafts.update = counting_update
drafts.extend = counting_extend
drafts.after_step = counting_after_step

tok = AutoTokenizer.from_pretrained(model_dir)
# On the GPU the model takes the server's load sequence (the knobs' kernels swapped in, the fused
# weights), so its steps are batch-invariant in bfloat16 as a server's are: without it cuBLAS and
# sdpa pick kernels by a step's row count, and a drafting step's rows lose the serial step's bits
# (a seeded sampled reply parted from the serial one on an H100). On the CPU, torch's plain
# float32 kernels are invariant already.
load = load_hooks.sequence() if device == "cuda" else None
load_kwargs = load.before({}) if load is not None else {}
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16 if device == "cuda" else torch.float32,
                                             attn_implementation="sdpa", **load_kwargs).eval().to(device)
if load is not None:
    load.after(model)
asked = [ids for _, ids in edit_prompts(tok, 384)][:3]
eos = model.generation_config.eos_token_id


def cache():
    """A fresh config a run: the engine resolves its unset fields in place (the request count of the
    first run would size every later one's batch)."""
    return ContinuousBatchingConfig(num_blocks=64, max_batch_tokens=512, page_size=32,
                                    use_async_batching=True if device == "cuda" else None)


def config():
    """Greedy unless a request's Spec says otherwise."""
    return GenerationConfig(do_sample=False, max_new_tokens=max_new, eos_token_id=eos, pad_token_id=0)


def greedy(inputs):
    out = model.generate_batch(inputs=inputs, generation_config=config(), continuous_batching_config=cache(),
                               progress_bar=False)
    return [list(out[k].generated_tokens) for k in sorted(out, key=lambda k: int(str(k).rsplit("_", 1)[-1]))]


def with_specs(requests, lengths=None):
    """[(request id, prompt ids, Spec or None: greedy)] submitted together to one engine, with
    replies of `lengths` tokens (default: max_new each): their replies, in order."""
    manager = model.init_continuous_batching(generation_config=config(), continuous_batching_config=cache())
    manager.start()
    try:
        for k, (rid, ids, spec) in enumerate(requests):
            if spec is not None:
                sampler.register(rid, spec)
            manager.add_request(ids, request_id=rid, max_new_tokens=lengths[k] if lengths else max_new)
        replies = {}
        while len(replies) < len(requests):
            result = manager.get_result(timeout=120)
            if result is None:
                raise RuntimeError("no result within 120 s")
            if result.is_finished():
                assert result.error is None, result.error
                replies[result.request_id] = list(result.generated_tokens)
        return [replies[rid] for rid, _, _ in requests]
    finally:
        manager.stop(block=True)
        for rid, _, _ in requests:
            sampler.release(rid)


def sampled(indices):
    return with_specs([(f"s{i}", asked[i], sampler.Spec(do_sample=True, temperature=0.8, top_p=0.95, seed=1000 + i))
                       for i in indices])


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags", "n"],
          "properties": {"name": {"type": "string", "maxLength": 24},
                         "tags": {"type": "array", "items": {"enum": ["alpha", "beta", "gamma"]}, "maxItems": 3},
                         "n": {"type": "integer", "minimum": 0, "maximum": 99999}}}
OBJECT = '{"name": "textwrap reader", "tags": ["alpha", "beta"], "n": 1234}'


def masked(indices, sample: bool):
    """Each request thinks under a 12-token budget (0150), then writes JSON under a grammar (0130):
    masked rows, `</think>` forced where the budget ends. The prompts hold the object to copy."""
    from transformers._pb.api import grammar, thinking

    vocab = model.config.vocab_size
    comp = grammar.compiler(tok, vocab, list(eos) if isinstance(eos, (list, tuple)) else [eos])
    compiled = grammar.compile_body(comp, "json", SCHEMA, "response_format")
    end_think = tok.convert_tokens_to_ids("</think>")
    requests = []
    for i in indices:
        budget = thinking.Budget(lambda: grammar.Constraint(compiled, tok, vocab, "think"), end_think, 12, max_new)
        settings = {"do_sample": True, "temperature": 0.8, "top_p": 0.95, "seed": 2000 + i} if sample else {}
        ids = tok(f"Copy this object {i} as it is: {OBJECT}\n{OBJECT}\n{OBJECT}\n")["input_ids"]
        requests.append((f"m{i}", ids, sampler.Spec(mask=budget, **settings)))
    return with_specs(requests)


def staggered(lengths):
    """Greedy requests with replies of `lengths` tokens, submitted together to one engine."""
    return with_specs([(f"g{i}", asked[i], None) for i in range(len(lengths))], lengths)


def follow_up(keep: int):
    """A request, then one whose prompt is the first's prompt and the first `keep` tokens of its
    reply, in one engine: the second reuses the prefix blocks the first completed while it
    decoded (hashed from kept tokens only, or the second reads a rejected draft's KV)."""
    manager = model.init_continuous_batching(generation_config=config(), continuous_batching_config=cache())
    manager.start()
    try:
        manager.add_request(asked[0], request_id="first", max_new_tokens=max_new)
        first = manager.get_result(request_id="first", timeout=120)
        while not first.is_finished():
            first = manager.get_result(request_id="first", timeout=120)
        manager.add_request(asked[0] + list(first.generated_tokens[:keep]), request_id="second",
                            max_new_tokens=max_new)
        second = manager.get_result(request_id="second", timeout=120)
        while not second.is_finished():
            second = manager.get_result(request_id="second", timeout=120)
        cached = manager.batch_processor.cache
        return [list(first.generated_tokens), list(second.generated_tokens)], cached.use_prefix_sharing
    finally:
        manager.stop(block=True)


torch.manual_seed(0)
out = {"prompt_tokens": [len(p) for p in asked], "counts": {}}
for phase, run in (("greedy_together", lambda: greedy(asked)),
                   ("greedy_alone", lambda: [greedy([p])[0] for p in asked]),
                   ("sampled_together", lambda: sampled(range(len(asked)))),
                   ("sampled_alone", lambda: [sampled([i])[0] for i in range(len(asked))]),
                   ("follow_up", lambda: follow_up(max_new - 8)),
                   ("masked_greedy", lambda: masked(range(3), False)),
                   ("masked_sampled", lambda: masked(range(3), True)),
                   ("masked_alone", lambda: [masked([i], True)[0] for i in range(3)]),
                   ("greedy_staggered", lambda: staggered([max_new // 3, 2 * max_new // 3, max_new]))):
    if os.environ.get("DRAFT_JOB_PHASES") and phase not in os.environ["DRAFT_JOB_PHASES"].split(","):
        continue
    out[phase] = run()
    out["counts"][phase] = dict(counts)
    counts.update(dict.fromkeys(counts, 0))
print(json.dumps(out))

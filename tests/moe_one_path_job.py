"""Run by tests/test_moe_one_path.py under Triton's CPU interpreter (TRITON_INTERPRET=1) with the
patched engine first on PYTHONPATH and PB_MOE_ONE_PATH=1 (PB_VARLEN_ATTENTION=1 and
PB_INVARIANT_GEMM=1 for the tiny model): 0390's large steps against upstream's eager experts, a
token's bits alone and among steps of every size, the ordered combine, and the tiny model's log
probabilities alone and batched with all three knobs; with PB_MOE_TMA=1, 0430's weight reads
through TMA against the pointer path in float16. Prints one JSON line. Float32 elsewhere (the
interpreter's bfloat16 dot is wrong in this machine's Triton)."""

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") == "1"

import torch  # noqa: E402
from transformers import Glm4MoeConfig  # noqa: E402
from transformers._pb.ops import fused_moe, moe_one_path  # noqa: E402
from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeExperts  # noqa: E402

torch.manual_seed(0)
moe_one_path.at_load()
report = {"enabled": moe_one_path.ENABLED}

# air12's routing at toy widths: 16 experts, 8 a token, so 65 tokens pass FUSED_MAX_PAIRS (512 pairs)
module = Glm4MoeExperts(Glm4MoeConfig(hidden_size=64, moe_intermediate_size=32, n_routed_experts=16,
                                      num_experts_per_tok=8))
module.config._experts_implementation = "eager"
with torch.no_grad():
    module.gate_up_proj.normal_(0, 0.1)
    module.down_proj.normal_(0, 0.1)
tokens = 200
x = torch.randn(tokens, 64)
index = torch.stack([torch.randperm(16)[:8] for _ in range(tokens)])
index[3, 2] = 16  # a masked pair (routed to another rank): it contributes nothing
weights = torch.rand(tokens, 8)
with torch.no_grad():
    alone = fused_moe.experts_forward(module, x[:1], index[:1], weights[:1])
    big = fused_moe.experts_forward(module, x, index, weights)
    report["large_vs_eager_max_abs"] = (big - module(x, index, weights)).abs().max().item()
    report["first_token_alone_vs_among"] = {
        str(n): bool(torch.equal(fused_moe.experts_forward(module, x[:n], index[:n], weights[:n])[0], alone[0]))
        for n in (2, 63, 64, 65, 100, 200)}

    # the combine: each token's rows added k = 0, 1, ... in float32
    def ordered_sum(rows):  # [tokens, top_k, hidden]
        total = rows[:, 0].clone()
        for k in range(1, rows.shape[1]):
            total += rows[:, k]
        return total

    y = torch.randn(7 * 8, 300)
    routed = torch.stack([torch.randperm(16)[:8] for _ in range(7)])
    report["combine_is_ordered_sum"] = bool(torch.equal(moe_one_path.combine(y, routed, 16),
                                                        ordered_sum(y.view(7, 8, 300))))
    report["combine_no_tokens"] = list(moe_one_path.combine(y[:0], routed[:0], 16).shape)
    routed[2, 5], routed[4, 0] = 16, -1  # masked pairs: their rows hold garbage, and are skipped
    skipped = y.view(7, 8, 300).clone()
    skipped[2, 5], skipped[4, 0] = 0, 0
    want = ordered_sum(skipped)
    y[2 * 8 + 5], y[4 * 8] = float("nan"), float("inf")
    report["combine_skips_masked_rows"] = bool(torch.equal(moe_one_path.combine(y, routed, 16), want))

    # the same first token with the knob off: above 64 tokens the step is grouped_mm's
    moe_one_path.restore()
    report["off_first_token_equal_at_200"] = bool(torch.equal(
        fused_moe.experts_forward(module, x, index, weights)[0], fused_moe.experts_forward(module, x[:1], index[:1],
                                                                                           weights[:1])[0]))
    moe_one_path.at_load()
    report["tma_at_load"] = moe_one_path.TMA

    # 0430: the large step's weights through TMA descriptors (half precision, which TMA takes)
    half = Glm4MoeExperts(module.config).half()
    with torch.no_grad():
        half.gate_up_proj.copy_(module.gate_up_proj)
        half.down_proj.copy_(module.down_proj)
    built, real = [], moe_one_path.weight_descriptors

    def counted(*args):
        found = real(*args)
        built.append(found is not None)
        return found

    moe_one_path.weight_descriptors = counted
    try:
        moe_one_path.TMA = False
        pointer = fused_moe.experts_forward(half, x.half(), index, weights.half())
        moe_one_path.TMA = True
        through_tma = fused_moe.experts_forward(half, x.half(), index, weights.half())
        small = fused_moe.experts_forward(half, x[:3].half(), index[:3], weights[:3].half())  # decode-sized
        floats = fused_moe.experts_forward(module, x, index, weights)  # float32 weights: the pointer path
    finally:
        moe_one_path.weight_descriptors = real
    report["tma"] = {"descriptors": built, "equal": bool(torch.equal(through_tma, pointer)),
                     "max_abs_vs_eager": (through_tma.float() - module(x, index, weights)).abs().max().item(),
                     "small_rows": list(small.shape), "float32_equal": bool(torch.equal(floats, big))}
    moe_one_path.TMA = report["tma_at_load"]

    # 0910: with PB_MOE_DECODE_ROWS=64 a step of at most 64 rows an expert (16 experts: 128 tokens,
    # 1,024 pairs) keeps the decode launch's 16-row blocks; the first token's bits stay its own
    from transformers._pb import knobs

    from moe_launches import block_rows

    os.environ["PB_MOE_DECODE_ROWS"] = "64"
    knobs.load()
    moe_one_path.at_load()
    try:
        with block_rows(fused_moe) as launches:
            equal = {str(n): bool(torch.equal(fused_moe.experts_forward(module, x[:n], index[:n], weights[:n])[0],
                                              alone[0]))
                     for n in (100, 128, 129, 200)}
        report["decode_rows"] = {"at_load": moe_one_path.DECODE_ROWS, "block_rows": launches,
                                 "first_token_alone_vs_among": equal}
    finally:
        del os.environ["PB_MOE_DECODE_ROWS"]
        knobs.load()
        moe_one_path.at_load()
    report["decode_rows"]["after_unset"] = moe_one_path.DECODE_ROWS


def tiny_logprobs(model_dir: str) -> dict:
    """The tiny model (8 experts, 2 a token) with 0220's kernels: a short prompt alone (few enough
    pairs for the decode size) and beside three longer ones (above it), through the batching loop.
    FUSED_MAX_PAIRS is cut to 16 so the tiny model's steps cross it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers._pb.ops import invariant_gemm, varlen_attention
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    fused_moe.register()
    saved_max, fused_moe.FUSED_MAX_PAIRS = fused_moe.FUSED_MAX_PAIRS, 16
    invariant_gemm.at_load()
    varlen_attention.at_load()
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32,
                                                 experts_implementation=fused_moe.NAME)
    texts = ("Hi", "The quick brown fox jumps over the lazy dog, and then it runs far away",
             "import os\nimport sys\nprint(os.getcwd(), sys.argv)", "Once upon a time, in a land far away, there")
    prompts = [tok(t)["input_ids"] for t in texts]
    config = GenerationConfig(max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)
    # a pool of 16 pages: left to upstream, the pool is sized from the host's free memory, and
    # allocating and filling that takes seconds a run on the CPU
    cb = ContinuousBatchingConfig(return_logprobs=True, num_blocks=16)
    steps = []
    real = fused_moe.experts_forward

    def counted(self, hidden_states, *args):
        steps.append(hidden_states.shape[0])
        return real(self, hidden_states, *args)

    def run(batch):
        outs = model.generate_batch(batch, generation_config=config, continuous_batching_config=cb,
                                    progress_bar=False)
        return [(outs[r].generated_tokens, outs[r].logprobs) for r in sorted(outs)]

    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    ALL_EXPERTS_FUNCTIONS.register(fused_moe.NAME, counted)
    try:
        moe_one_path.ENABLED = True
        alone = run([prompts[0]])[0]
        together = run(prompts)[0]
        out = {"short_prompt_pairs": len(prompts[0]) * 2, "largest_step_tokens": max(steps),
               "one_path": {"logprobs_equal": alone[1] == together[1], "tokens_equal": alone[0] == together[0],
                            "max_abs_diff": max(abs(a - b) for a, b in zip(alone[1], together[1]))}}
    finally:
        ALL_EXPERTS_FUNCTIONS.register(fused_moe.NAME, real)
        fused_moe.FUSED_MAX_PAIRS = saved_max
        invariant_gemm.restore()
        varlen_attention.restore()
        moe_one_path.at_load()
    return out


if len(sys.argv) > 1:
    report["tiny"] = tiny_logprobs(sys.argv[1])
print(json.dumps(report))

"""Run by tests/test_invariant_gemm.py under Triton's CPU interpreter (TRITON_INTERPRET=1) with the
patched engine first on PYTHONPATH and PB_INVARIANT_GEMM=1 (and, for the tiny model's batched ==
alone, PB_VARLEN_ATTENTION=1): 0380's GEMM against a float64 product on random shapes, a row alone
against the same row among others on both of its paths, torch's mm and addmm through the
registration, a router's logits; or, given the tiny model's folder, its log probabilities alone
and batched instead. Prints one JSON line.

The interpreter's bfloat16 dot is wrong in the Triton this machine has (it returns garbage for a
plain product), so the products here are float32 and float16; the GPU test runs bfloat16."""

import contextlib
import json
import random
import sys

import torch
import torch.nn.functional as F

from transformers._pb.ops import invariant_gemm

DTYPES = {"float32": torch.float32, "float16": torch.float16}


def random_products(count: int = 30) -> dict:
    """Random [M, K] @ W.T (+ bias) as F.linear lays them out, against float64."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    worst = {name: 0.0 for name in DTYPES}
    for _ in range(count):
        name = rng.choice(list(DTYPES))
        m, n, k = rng.choice([1, 2, 3, 64, 65, rng.randint(1, 200)]), rng.randint(1, 300), rng.randint(1, 400)
        x = torch.randn((m, k), generator=gen).to(DTYPES[name])
        w = torch.randn((n, k), generator=gen).to(DTYPES[name])
        bias = torch.randn((n,), generator=gen).to(DTYPES[name]) if rng.random() < 0.5 else None
        got = invariant_gemm.gemm(x, w.t(), bias).double()
        want = x.double() @ w.double().t() + (0 if bias is None else bias.double())
        scale = x.double().abs() @ w.double().abs().t() + 1  # the size of the sum's terms
        worst[name] = max(worst[name], ((got - want).abs() / scale).max().item())
    return {"cases": count, "worst_relative": worst}


# the kernel's two paths: chunks as programs up to CHUNK_MAX_ROWS rows, and (with 0) one program a tile
BOTH_PATHS = (("chunk_programs", invariant_gemm.CHUNK_MAX_ROWS), ("one_program_a_tile", 0))


@contextlib.contextmanager
def chunk_max_rows(rows: int):
    """invariant_gemm.CHUNK_MAX_ROWS set to `rows` for the block, then restored."""
    saved, invariant_gemm.CHUNK_MAX_ROWS = invariant_gemm.CHUNK_MAX_ROWS, rows
    try:
        yield
    finally:
        invariant_gemm.CHUNK_MAX_ROWS = saved


def rows_alone_vs_batched() -> dict:
    """The first row of an M-row product against the same row alone, on the chunked path (few
    rows) and on the one-program path (forced by a smaller program target)."""
    gen = torch.Generator().manual_seed(1)
    n, k = 300, 1000
    w = torch.randn((n, k), generator=gen)
    bias = torch.randn((n,), generator=gen)
    x = torch.randn((130, k), generator=gen)
    alone = invariant_gemm.gemm(x[:1], w.t(), bias)
    out = {"chunks": -(-k // invariant_gemm.chunk_k(n, k))}
    # the chunk length is the weight's: the same on both paths, so both sum alike
    for label, max_rows in BOTH_PATHS:
        with chunk_max_rows(max_rows):
            out[label] = {str(m): bool(torch.equal(invariant_gemm.gemm(x[:m], w.t(), bias)[0], alone[0]))
                          for m in (1, 2, 7, 64, 65, 130)}
    return out


def router() -> dict:
    """A router's float32 logits from half-precision operands: against float64, and a row alone
    against the same row among others, with the chunks as programs and in one program."""
    gen = torch.Generator().manual_seed(4)
    w = (torch.randn((128, 512), generator=gen) * 0.05).half()
    x = torch.randn((70, 512), generator=gen).half()
    logits = invariant_gemm.router_logits(x, w)
    want = x.double() @ w.double().t()
    alone = invariant_gemm.router_logits(x[:1], w)
    out = {"chunks": -(-512 // invariant_gemm.chunk_k(128, 512)), "dtype": str(logits.dtype),
           "worst_abs": (logits.double() - want).abs().max().item()}
    for (_, max_rows), label in zip(BOTH_PATHS, ("alone_equal", "alone_equal_one_program")):
        with chunk_max_rows(max_rows):
            out[label] = {str(m): bool(torch.equal(invariant_gemm.router_logits(x[:m], w)[0], alone[0]))
                          for m in (2, 16, 70)}
    return out


def registered() -> dict:
    """torch's mm and addmm, and so nn.Linear, go through the kernel; other dtypes keep torch's."""
    gen = torch.Generator().manual_seed(2)
    x = torch.randn((5, 3, 40), generator=gen)
    w, b = torch.randn((24, 40), generator=gen), torch.randn((24,), generator=gen)
    calls = []
    real = invariant_gemm.gemm

    def counted(*args):
        calls.append(args[0].shape[0])
        return real(*args)

    invariant_gemm.gemm = counted
    try:
        linear = F.linear(x, w, b)  # 3-D input with a bias: flattened into one addmm
        plain = x.reshape(15, 40) @ w.t()
        scaled = torch.addmm(b.expand(15, 24), x.reshape(15, 40), w.t(), beta=0.5, alpha=2.0)
        doubles = torch.mm(x.reshape(15, 40).double(), w.t().double())
    finally:
        invariant_gemm.gemm = real
    want = x.double() @ w.double().t()
    return {"kernel_rows": calls,
            "linear_close": bool(torch.allclose(linear.double(), want + b.double(), atol=1e-4)),
            "mm_close": bool(torch.allclose(plain.double(), want.reshape(15, 24), atol=1e-4)),
            "addmm_scaled_close": bool(torch.allclose(scaled.double(), 0.5 * b.double() + 2 * want.reshape(15, 24),
                                                      atol=1e-4)),
            "float64_dtype": str(doubles.dtype),
            "float64_close": bool(torch.allclose(doubles, want.reshape(15, 24), atol=1e-9)),
            "empty": list(torch.mm(torch.zeros((0, 40)), w.t()).shape),
            "k_zero_with_bias": bool(torch.equal(torch.addmm(b, torch.zeros((2, 0)), torch.zeros((0, 24))),
                                                 b.expand(2, 24)))}


def tma() -> dict:
    """0410: prompt-sized products through TMA descriptors against the pointer path (same tiles:
    the interpreter's bits follow the tile), the steps that keep the pointer path, and a row
    alone against the same row among others with the one-program path reading through TMA."""
    gen = torch.Generator().manual_seed(5)
    built = []
    real = invariant_gemm._descriptors

    def counted(*args):
        found = real(*args)
        built.append(found is not None)
        return found

    cases = {"one chunk, bias": (300, 200, 640, True), "narrow, 16 chunks": (300, 40, 1024, False),
             "chunked, K off 64, bias": (260, 300, 1000, True)}
    out = {}
    invariant_gemm._descriptors = counted
    try:
        for label, (m, n, k, has_bias) in cases.items():
            x = torch.randn((m, k), generator=gen).half()
            w = (torch.randn((n, k), generator=gen) * 0.05).half()
            bias = torch.randn((n,), generator=gen).half() if has_bias else None
            invariant_gemm.TMA = True
            got = invariant_gemm.gemm(x, w.t(), bias)
            invariant_gemm.TMA = False
            out[label] = {"chunks": -(-k // invariant_gemm.chunk_k(n, k)), "tma": built[-1] if built else None,
                          "equal": bool(torch.equal(got, invariant_gemm.gemm(x, w.t(), bias)))}
            built.clear()
        w = (torch.randn((128, 512), generator=gen) * 0.05).half()
        x = torch.randn((300, 513), generator=gen).half()
        invariant_gemm.TMA = True
        router = invariant_gemm.router_logits(x[:, :512], w)  # rows 1,026 bytes apart: off 16 bytes
        router_built = list(built)
        built.clear()
        small = invariant_gemm.gemm(x[:200, :512].contiguous(), w.t())  # decode-sized: the pointer path
        small_built = list(built)
        built.clear()
        aligned = invariant_gemm.router_logits(x[:, :512].contiguous(), w)
        aligned_built = list(built)
        # a row alone (chunks as programs, pointer loads) and among 2 ... 300 rows through TMA
        w_rows = (torch.randn((300, 1000), generator=gen) * 0.05).half()
        x_rows = torch.randn((300, 1000), generator=gen).half()
        built.clear()
        alone = invariant_gemm.gemm(x_rows[:1], w_rows.t())
        rows = {"300": bool(torch.equal(invariant_gemm.gemm(x_rows, w_rows.t())[0], alone[0]))}
        with chunk_max_rows(0):
            rows.update({str(m): bool(torch.equal(invariant_gemm.gemm(x_rows[:m], w_rows.t())[0], alone[0]))
                         for m in (2, 65, 130)})
        rows["tma"] = list(built)
        invariant_gemm.TMA = False
        out["router"] = {"dtype": str(aligned.dtype), "tma": aligned_built,
                         "equal": bool(torch.equal(aligned, invariant_gemm.router_logits(x[:, :512].contiguous(), w))),
                         "unaligned_tma": router_built, "unaligned_equal": bool(torch.equal(router, aligned))}
        out["small_rows"] = {"descriptors_asked": small_built,
                             "equal": bool(torch.equal(small, invariant_gemm.gemm(x[:200, :512].contiguous(), w.t())))}
        out["rows"] = rows
    finally:
        invariant_gemm._descriptors = real
        invariant_gemm.TMA = False
    return out


def tiny_logprobs(model_dir: str) -> dict:
    """The tiny model's greedy tokens and their log probabilities through the batching loop, each
    prompt alone and all prompts together."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32)
    texts = ("def fibonacci(n):", "The quick brown fox jumps over the lazy dog, and then", "import os\n",
             "Once upon a time")
    prompts = [tok(t)["input_ids"] for t in texts]
    config = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    # a pool of 16 pages: left to upstream, the pool is sized from the host's free memory, and
    # allocating and filling that takes seconds a run on the CPU
    cb = ContinuousBatchingConfig(return_logprobs=True, num_blocks=16)

    def run(batch):
        outs = model.generate_batch(batch, generation_config=config, continuous_batching_config=cb,
                                    progress_bar=False)
        return [(outs[r].generated_tokens, outs[r].logprobs) for r in sorted(outs)]

    alone = [run([p])[0] for p in prompts]
    together = run(prompts)
    return {"prompts": len(prompts), "tokens_equal": [a[0] == t[0] for a, t in zip(alone, together)],
            "logprobs_equal": [a[1] == t[1] for a, t in zip(alone, together)],
            "logprob_counts": [len(t[1]) for t in together],
            "max_abs_diff": max(abs(x - y) for a, t in zip(alone, together) for x, y in zip(a[1], t[1]))}


gen = torch.Generator().manual_seed(3)
x, w = torch.randn((9, 33), generator=gen), torch.randn((33, 17), generator=gen)
before = torch.mm(x, w)
invariant_gemm.at_load()
tma_at_load, invariant_gemm.TMA = invariant_gemm.TMA, False  # 0410 is checked on its own below
report = {"registered_at_load": invariant_gemm._library is not None, "tma_at_load": tma_at_load}
if len(sys.argv) > 1:  # the tiny model's part alone, run beside the kernels' (each keeps one core busy)
    from transformers._pb.ops import varlen_attention

    varlen_attention.at_load()
    report["tiny"] = tiny_logprobs(sys.argv[1])
    varlen_attention.restore()
else:
    report.update(random=random_products(), rows=rows_alone_vs_batched(), torch_ops=registered(), router=router(),
                  tma=tma())
invariant_gemm.restore()
hidden, experts = torch.randn((3, 40), generator=gen).half(), torch.randn((8, 40), generator=gen).half()
report["restored"] = {"registered": invariant_gemm._library is not None,
                      "mm_is_torchs": bool(torch.equal(torch.mm(x, w), before)),
                      "router_is_torchs": bool(torch.equal(invariant_gemm.router_logits(hidden, experts),
                                                           F.linear(hidden.float(), experts.float())))}
print(json.dumps(report))

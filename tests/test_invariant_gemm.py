"""0380 PB_INVARIANT_GEMM: torch's mm and addmm as GEMMs whose sums are fixed by the weight's
shape, under Triton's CPU interpreter.

Checked here: the product against float64 on random shapes, a row's bits alone and among others
on both of the kernel's paths, the registration as torch's ops, a router's float32 logits from
half-precision operands, and, with 0370's attention, the tiny model's log probabilities the same
bits alone and batched. Its speed and its bits at bfloat16 on a GPU are for
tests/test_kernels_gpu.py and the results windows."""

import json

import pytest

from .conftest import engine_code, engine_jobs

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def on(patched_engine, tiny_model):
    """The kernels' checks and the tiny model's, two jobs side by side."""
    env = {"TRITON_INTERPRET": "1", "PB_INVARIANT_GEMM": "1", "PB_GEMM_TMA": "1", "PB_VARLEN_ATTENTION": "1"}
    with engine_jobs("invariant_gemm_job.py", patched_engine, runs={"kernels": env}, timeout=1200) as kernels, \
            engine_jobs("invariant_gemm_job.py", patched_engine, tiny_model, runs={"tiny": env}, timeout=1200) as tiny:
        return {**kernels["kernels"].report(), "tiny": tiny["tiny"].report()["tiny"]}


def test_products_match_float64_on_random_shapes(on):
    assert on["registered_at_load"] is True
    assert on["random"]["cases"] == 30
    # relative to the sum of the terms' sizes: float32 sums, then the output's rounding
    assert on["random"]["worst_relative"]["float32"] < 1e-6
    assert on["random"]["worst_relative"]["float16"] < 2e-3


def test_a_row_gets_the_same_bits_alone_and_among_others_on_both_paths(on):
    rows = on["rows"]
    assert rows["chunks"] > 1  # the K sum really is cut into chunks
    assert all(rows["chunk_programs"].values()), rows
    assert all(rows["one_program_a_tile"].values()), rows


def test_torchs_ops_and_linear_layers_run_the_kernel(on):
    ops = on["torch_ops"]
    # F.linear on [5, 3, 40] (one addmm of 15 rows), x @ w.T, and addmm with beta/alpha: the kernel;
    # the float64 product: torch's
    assert ops["kernel_rows"] == [15, 15, 15]
    assert ops["linear_close"] and ops["mm_close"] and ops["addmm_scaled_close"]
    assert ops["float64_dtype"] == "torch.float64" and ops["float64_close"]
    assert ops["empty"] == [0, 24]
    assert ops["k_zero_with_bias"] is True


def test_router_logits_sum_half_precision_operands_in_float32_the_same_alone_and_batched(on):
    router = on["router"]
    assert router["chunks"] > 1  # 128 experts: the K sum is cut so one row has programs enough
    assert router["dtype"] == "torch.float32"
    assert router["worst_abs"] < 1e-4  # float32 sums of exact products; the operands are exact in float64 too
    assert all(router["alone_equal"].values()), router
    assert all(router["alone_equal_one_program"].values()), router


def test_tma_reads_give_the_pointer_paths_bits_where_the_operands_allow(on):
    tma = on["tma"]
    assert on["tma_at_load"] is True
    for label in ("one chunk, bias", "narrow, 16 chunks", "chunked, K off 64, bias"):
        assert tma[label]["tma"] is True and tma[label]["equal"] is True, (label, tma[label])
    assert tma["narrow, 16 chunks"]["chunks"] == 16 and tma["chunked, K off 64, bias"]["chunks"] > 1
    # the router's float32 logits from half operands through TMA; rows 1,026 bytes apart cannot be
    # read by TMA and take the pointer path, with the same bits
    assert tma["router"] == {"dtype": "torch.float32", "tma": [True], "equal": True, "unaligned_tma": [False],
                             "unaligned_equal": True}
    assert tma["small_rows"] == {"descriptors_asked": [], "equal": True}  # 200 rows: a decode-sized step
    # a half-precision row alone (chunks as programs) against the same row among 2 ... 300 rows read through TMA
    assert tma["rows"] == {"300": True, "2": True, "65": True, "130": True, "tma": [True] * 4}, tma["rows"]


def test_restore_gives_torchs_own_product_back(on):
    assert on["restored"] == {"registered": False, "mm_is_torchs": True, "router_is_torchs": True}


def test_tiny_model_with_0370_gives_a_request_the_same_logprobs_alone_and_batched(on):
    tiny = on["tiny"]
    assert tiny["prompts"] == 4 and tiny["logprob_counts"] == [10, 10, 10, 10]
    assert all(tiny["tokens_equal"]) and all(tiny["logprobs_equal"]), tiny
    assert tiny["max_abs_diff"] == 0.0


LAST_SUM_CODE = """
import json, torch
from transformers._pb.ops import invariant_gemm as ig
ig.at_load()  # PB_FEWER_LAUNCHES is on in this process's environment
out = {"at_load": ig.LAST_SUM}
seconds = []  # the second launches (pb_gemm_sum) run
sum_parts = ig._sum_parts
ig._sum_parts = lambda *args: (seconds.append(1), sum_parts(*args))[1]
gen = torch.Generator().manual_seed(5)


def both(label, run):
    ig.LAST_SUM = False
    before = len(seconds)
    want = run()
    off = len(seconds) - before
    ig.LAST_SUM = True
    before = len(seconds)
    got, again = run(), run()  # twice: the counters are back at zero after a launch
    out[label] = {"equal": torch.equal(want, got) and torch.equal(want, again), "second_off": off,
                  "second_on": len(seconds) - before}


# (rows, weight rows, K, bias): chunked sums (K over 4,096, or few columns), 1 to 256 rows
for m, n, k, bias in ((1, 40, 5000, True), (7, 300, 4100, False), (64, 96, 4500, True), (256, 20, 700, False)):
    x, w = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    both(f"gemm {m} {n} {k}", lambda: ig.gemm(x, w.t(), b))
# 0810's float8 GEMM: a 130 x 1,000 weight in 128 x 128 blocks, chunked by its few tiles
q = (torch.randn(130, 1000, generator=gen) * 50).to(torch.float8_e4m3fn)
grid, grid_rows = torch.rand(2, 8, generator=gen) + 0.5, (torch.arange(130) // 128).int()
for m in (1, 9):
    x, b = torch.randn(m, 1000, generator=gen), torch.randn(130, generator=gen)
    both(f"fp8 {m}", lambda: ig.gemm_fp8(x, q, grid, grid_rows, 0, 128, b))
# more output tiles than the counters: the second launch again
ig.COUNTERS = 2
x, w = torch.randn(3, 5000, generator=gen), torch.randn(300, 5000, generator=gen)
both("past the counters", lambda: ig.gemm(x, w.t()))
out["counters_zero"] = [int(c.abs().sum()) == 0 for c in ig._counters.values()]
out["chunks"] = {"gemm": -(-5000 // ig.chunk_k(40, 5000)), "fp8": -(-1000 // ig.fp8_chunk_k(130, 1000))}
print(json.dumps(out))
"""


def test_last_sum_adds_the_parts_in_the_products_own_launch_with_the_same_bits(patched_engine):
    """0950: a chunked product's parts added by each tile's last program give the bits of the
    second launch (pb_gemm_sum) they replace, for 0380's GEMM at 1-256 rows and 0810's float8
    GEMM, with no second launch run; launched twice in a row (the counters go back to zero); a
    product of more tiles than the counters hold keeps the second launch."""
    proc = engine_code(LAST_SUM_CODE, patched_engine, timeout=900, PB_FEWER_LAUNCHES="1", TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out.pop("at_load") is True and "PB_FEWER_LAUNCHES" in proc.stderr
    assert out.pop("chunks")["gemm"] > 1 and all(out.pop("counters_zero")), out
    past = out.pop("past the counters")
    assert past == {"equal": True, "second_off": 1, "second_on": 2}, past
    assert len(out) == 6 and all(r == {"equal": True, "second_off": 1, "second_on": 0} for r in out.values()), out

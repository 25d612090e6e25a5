"""PB_INVARIANT_GEMM: every matrix product of the model (torch's mm and addmm) as a Triton GEMM whose
sum for an output element does not depend on how many rows the product has.

The BLAS library picks its kernel, its tile and its split of the K sum by the whole problem's
shape, so a token's row gets other bits when the step holds 1, 32 or 65 rows. On an H200 (W10,
invariance-probe) the o_proj GEMM, the shared expert's gate/up GEMM and the router's float32
logits gave a row other bits among others than alone: part of why a request's reply depends on
the requests batched with it.

Here each output element's K range is cut into chunks whose length depends only on the weight's
shape (N, K), never on the row count (`chunk_k`): one chunk for most weights, a few for a long K
(o_proj) and up to 16 for a narrow weight (a router's 128 experts). Each chunk is summed from zero
(tl.dot, float32 accumulator), and the chunks' sums are added to zero in order. For few rows
(decode steps) each chunk is a program of its own, so a GEMV still has enough programs to keep
the memory busy, and a second kernel adds the chunks in order; for many rows (prompts) one
program runs its chunks one after another. Both give the same bits, and a row's arithmetic never
involves another row. The tile a launch uses follows the row count, for speed only: on an H200
an element's bits were the same for every tile measured (W11 tile-bits, W12 tune), given the
same chunks; tests/test_kernels_gpu.py checks a row's bits alone against the same row among up
to 8,192 rows on every GPU run. The bias, when the product has one, is added in float32 before
the result is rounded to the output's type.

With the knob on, `at_load` registers these as torch's `mm` and `addmm` for CUDA tensors (and,
under Triton's CPU interpreter in the tests, for CPU tensors), so every `nn.Linear`, `F.linear`
and tensor-parallel shard's local product takes them; `restore` gives torch's own back. Products
of other dtypes than bfloat16, float16 and float32 run as torch's batched product of one matrix.
Float32 products use IEEE float32 dots unless torch allows TF32 for matmuls. A router's float32
logits (0310's router, `router_logits`) are summed from its bfloat16 operands instead: the same
terms, exact in float32, on the tensor cores. Batched products (bmm) and the experts' grouped
products are not touched.

PB_FEWER_LAUNCHES (0950) adds a decode-sized product's chunk parts in the program of each output
tile that stores its part last (an atomic count a tile), instead of a second launch
(pb_gemm_sum) over them: the same parts added to zero in the same order, so the same bits, one
launch less a chunked product (W76: 62 of a C1 step's 534 kernels on air12-fp8 were such sums).
It applies to 0810's float8 products as well, with or without this module's registration.

PB_GEMM_TMA (0410, on top of this knob) reads a prompt-sized product's operands (more than
CHUNK_MAX_ROWS rows, half precision) through TMA descriptors: the same chunks and the same order
of sums, so the same bits (W13 launch-sweep-5: 0.99-1.13 of cuBLAS at 8,192 rows, against
1.15-1.31 with pointer loads).
"""

import sys
from typing import NamedTuple

import torch

from .. import knobs
from . import tma
from .common import INTERPRET, TRITON, dot_precision, fp8_depth, fp8_step_scale, kernels
CHUNK_UNIT = 64  # a chunk's length is a multiple of this (and every launch's BLOCK_K divides it)
LONG_K = 4096  # a weight's K is cut into chunks of at most this ...
CHUNK_TILE_N = 32  # ... and into more when its columns, in tiles of this, ...
MIN_PROGRAMS = 64  # ... give fewer programs than this for one row (a router's few experts)
MAX_CHUNKS = 16
CHUNK_MAX_ROWS = 256  # above this many rows one program runs a tile's chunks (no float32 parts in memory)
GROUP_M = 8  # row tiles per group in the one-program-a-tile path's order
FP8_TILE_N = 64  # 0810: weight rows a program of the float8 GEMM sums at decode sizes (fp8_tiles)
FP8_MIN_PROGRAMS = 264  # 0810: programs a one-row float8 product is cut into at least (two per SM of an H200)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_library = None  # torch.library.Library holding the registration while the knob is in force
TMA = False  # set by at_load: PB_GEMM_TMA (0410) on as well
LAST_SUM = False  # set by at_load: PB_FEWER_LAUNCHES (0950), for 0380's and 0810's chunked products
COUNTERS = 1 << 16  # 0950: output tiles a chunked product may have for its last programs to add the parts
_counters: dict = {}  # 0950: (device, stream) -> int32 [COUNTERS], zero between launches


class Tiles(NamedTuple):
    """One launch's tile: rows, columns, depth (BLOCK_K), warps, pipeline stages. On an H200 a
    Triton GEMM's element came out the same bits for every tile measured, depth included (W11
    tile-bits: 16-128 rows, 32-256 columns, 32-128 deep; W12 tune: every tile of the sweep
    against the row alone), given the same chunks, so the tile follows the row count for speed
    and the bits do not. Triton's CPU interpreter sums each BLOCK_K step as one numpy product,
    so there the depth does change the bits, and every launch runs 64 deep (the tests)."""

    m: int
    n: int
    k: int
    warps: int
    stages: int


def on() -> bool:
    return bool(knobs.get("PB_INVARIANT_GEMM"))


def chunk_k(n: int, k: int) -> int:
    """The length of K a chunk sums, a multiple of CHUNK_UNIT: from the weight's shape (n, k)
    alone. Long sums (o_proj's 12,288) are cut so a decode step has programs enough; narrow
    weights (a router's 128 experts) are cut so one row has MIN_PROGRAMS programs; the rest is
    one chunk, one accumulator, which suits a prompt's wide tiles (W12 tune)."""
    units = max(1, -(-k // CHUNK_UNIT))
    tiles_n = -(-n // CHUNK_TILE_N)
    chunks = min(units, MAX_CHUNKS, max(-(-k // LONG_K), -(-MIN_PROGRAMS // tiles_n), 1))
    return -(-units // chunks) * CHUNK_UNIT


def tiles(m: int, dtype: torch.dtype, chunked: bool) -> Tiles:
    """The launch tile for an m-row product (speed only: it does not change a sum). From the
    H200 sweep of W12 (tune2): CUDA-graph timings with the weights rotated past L2."""
    if dtype == torch.float32:
        t = Tiles(16, 64, 64, 4, 4) if m <= 16 else Tiles(64, 128, 64, 4, 3)
    elif chunked:  # o_proj, the router: few columns or a long K
        t = (Tiles(16, 32, 64, 4, 4) if m <= 16 else Tiles(32, 32, 64, 4, 4) if m <= 32
             else Tiles(64, 64, 64, 4, 4) if m <= CHUNK_MAX_ROWS else Tiles(128, 128, 64, 8, 4))
    else:  # one accumulator over the whole K
        t = (Tiles(16, 32, 128, 4, 4) if m <= 32 else Tiles(64, 128, 64, 4, 4) if m <= CHUNK_MAX_ROWS
             else Tiles(128, 128, 64, 8, 3))
    return t._replace(k=64) if INTERPRET else t


def tma_tiles(m: int, n: int, chunked: bool) -> Tiles | None:
    """0410's tile for an m-row product read through TMA, or None where the pointer path runs
    (decode-sized steps). From the H200 sweeps at 8,192 rows (W13 launch-sweep-5, W14
    launch-sweep-6): one-chunk sums take 256 x 128 for the wide weights (q/k/v, the dense layer's
    gate/up) and 128 x 128 for the rest; chunked sums 128 x 256 (o_proj 1.08 ms against 1.49 at
    128 x 128, cuBLAS 1.08), and 128 x 64 for a router's few columns. Under the interpreter,
    whose bits follow the tile, the pointer path's 128 x 128."""
    if m <= CHUNK_MAX_ROWS:
        return None
    if INTERPRET:
        return Tiles(128, 128, 64, 8, 3)
    if chunked:
        return Tiles(128, 256, 64, 8, 3) if n >= 1024 else Tiles(128, 64, 64, 4, 4)
    return Tiles(256, 128, 64, 8, 3) if n >= 8192 else Tiles(128, 128, 64, 8, 3)


def _descriptors(a: torch.Tensor, b: torch.Tensor, t: Tiles):
    """0410's TMA descriptors of A [M, K] and of the weight as [N, K] (b's transpose), or None
    where TMA cannot read them: a half-precision product whose K is contiguous in both, with
    16-byte aligned addresses and row strides, in a Triton with host descriptors."""
    if a.dtype not in (torch.bfloat16, torch.float16):
        return None
    found = tma.descriptor(a, [t.m, t.k]), tma.descriptor(b.t(), [t.n, t.k])
    return None if None in found else found


def _supported(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype in DTYPES and a.dtype == b.dtype and a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0]
            and a.device == b.device and (a.is_cuda or INTERPRET))


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """a [M, K] @ b [K, N] (+ bias [N]) with each element's sum fixed by (N, K) alone, in
    `out_dtype` (a's by default)."""
    kernel = kernels("invariant_gemm")
    (m, k), n = a.shape, b.shape[1]
    out = torch.empty((m, n), dtype=out_dtype or a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_() if bias is None else out.copy_(bias.expand(m, n))
    step = chunk_k(n, k)
    chunks = -(-k // step)
    t = tiles(m, a.dtype, chunks > 1)
    tiles_m, tiles_n = -(-m // t.m), -(-n // t.n)
    precision = dot_precision(a)
    bias_arg = out if bias is None else bias
    if chunks > 1 and m <= CHUNK_MAX_ROWS:
        parts = torch.empty((chunks, m, n), dtype=torch.float32, device=a.device)
        counters = tile_counters(a.device, tiles_m * tiles_n)
        kernel.pb_gemm_chunks[(tiles_m, tiles_n, chunks)](
            a, b, parts, parts if counters is None else counters, bias_arg, out, m, n, k, step, a.stride(0),
            a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), HAS_BIAS=bias is not None,
            LAST_SUM=counters is not None, BLOCK_M=t.m, BLOCK_N=t.n, BLOCK_K=t.k, PRECISION=precision,
            num_warps=t.warps, num_stages=t.stages)
        if counters is None:
            _sum_parts(parts, bias, out, t.n)
    elif TMA and (fast := tma_tiles(m, n, chunks > 1)) and step % fast.k == 0 and (
            descriptors := _descriptors(a, b, fast)):
        kernel.pb_gemm_tma[(-(-m // fast.m) * -(-n // fast.n),)](
            *descriptors, bias_arg, out, m, n, k, step, out.stride(0), out.stride(1), HAS_BIAS=bias is not None,
            CHUNKED=chunks > 1, BLOCK_M=fast.m, BLOCK_N=fast.n, BLOCK_K=fast.k, GROUP_M=GROUP_M,
            num_warps=fast.warps, num_stages=fast.stages)
    else:
        kernel.pb_gemm[(tiles_m * tiles_n,)](
            a, b, bias_arg, out, m, n, k, step, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
            out.stride(1), HAS_BIAS=bias is not None, CHUNKED=chunks > 1, BLOCK_M=t.m, BLOCK_N=t.n, BLOCK_K=t.k,
            GROUP_M=GROUP_M, PRECISION=precision, num_warps=t.warps, num_stages=t.stages)
    return out


def _sum_parts(parts: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor, block_n: int) -> None:
    """pb_gemm_sum: the chunks' float32 sums [chunks, M, N] added in order (and the bias) into out."""
    chunks, m, n = parts.shape
    sum_m = 32 if m > 16 else 16
    kernels("invariant_gemm").pb_gemm_sum[(-(-m // sum_m), -(-n // block_n))](
        parts, out if bias is None else bias, out, m, n, chunks, out.stride(0), out.stride(1),
        HAS_BIAS=bias is not None, BLOCK_M=sum_m, BLOCK_N=block_n, num_warps=4)


def fp8_tiles(m: int) -> Tiles:
    """0810's launch tile for an m-row float8 product, as (rows, weight rows, depth, warps, stages);
    the depth comes from common.fp8_depth. 64 or 128 weight rows a program: both run the same
    64-row tensor-core instruction, so a row's bits are the same for every tile (W53: 1 row
    against 4,096 at either width, and against 1-8,192 rows in tests/test_kernels_gpu.py); above
    32 rows the wider tile over 8 warps took 1.04 ms for q_proj at 4,096 rows against 1.54."""
    if m <= 32:
        return Tiles(16 if m <= 16 else 32, FP8_TILE_N, 0, 4, 4)
    return Tiles(64 if m <= CHUNK_MAX_ROWS else 128, 2 * FP8_TILE_N, 0, 8, 3)


def fp8_chunk_k(n: int, k: int) -> int:
    """0810: the length of K a chunk of the float8 GEMM sums, from the weight's shape alone: as
    many chunks (at most MAX_CHUNKS, each a whole number of 128-deep steps) as give one row
    FP8_MIN_PROGRAMS programs of FP8_TILE_N weight rows. The float8 weights' bytes are half the
    bf16 ones', so a decode step needs more programs in flight to keep the memory busy (W53: k_proj
    in 2 chunks of 16 programs took 19 us against the bf16 kernel's 11). A weight whose tiles alone
    number half of FP8_MIN_PROGRAMS is not cut: on one H100 (W76) Air's stacked q/k/v (224 tiles)
    took 27.3 us in one chunk against 30.4 in two at one row, 32.6 / 43.0 at 64 rows and 61.1 / 79.2
    at 128; the narrower products kept their chunks (o_proj, the dense down product: fewer were
    slower at one row)."""
    steps, tiles = -(-k // 128), -(-n // FP8_TILE_N)
    if tiles >= FP8_MIN_PROGRAMS // 2:  # wide enough alone: one chunk, no float32 parts to sum
        return steps * 128
    chunks = min(MAX_CHUNKS, steps, max(1, -(-FP8_MIN_PROGRAMS // tiles)))
    return -(-steps // chunks) * 128


def gemm_fp8(a: torch.Tensor, weight: torch.Tensor, grid: torch.Tensor, grid_rows: torch.Tensor, k_offset: int,
             scale_k: int, bias: torch.Tensor | None = None) -> torch.Tensor | None:
    """0810: a [M, K] @ W'^T (+ bias), W [N, K] float8 and W' its expansion to a's type,
    `float(W[n, k]) * grid[grid_rows[n], (k + k_offset) // scale_k]` (a tensor-parallel shard's
    columns start at model-wide column k_offset): each element summed in the chunks fp8_chunk_k
    gives (N, K), added in order. None where no depth keeps a step in one scale column."""
    (m, k), n = a.shape, weight.shape[0]
    step = fp8_chunk_k(n, k)
    chunks = -(-k // step)
    depth = fp8_depth(scale_k, k_offset, step)
    if depth is None or weight.stride(1) != 1 or k == 0:
        return None
    a = a if a.stride(1) == 1 else a.contiguous()
    out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return out
    t = fp8_tiles(m)
    tiles_n, tiles_m = -(-n // t.n), -(-m // t.m)
    split = chunks > 1 and m <= CHUNK_MAX_ROWS
    parts = torch.empty((chunks, m, n), dtype=torch.float32, device=a.device) if split else out
    counters = tile_counters(a.device, tiles_m * tiles_n) if split else None
    kernels("invariant_gemm").pb_gemm_fp8[(tiles_n, tiles_m, chunks if split else 1)](
        a, weight, grid, grid_rows, out if bias is None else bias, out, parts, parts if counters is None else counters,
        m, n, k, step, k_offset, a.stride(0), weight.stride(0), out.stride(0), out.stride(1), grid.stride(0),
        grid.stride(1), HAS_BIAS=bias is not None, SPLIT=split, LAST_SUM=counters is not None, SCALE_K=scale_k,
        BLOCK_M=t.m, BLOCK_N=t.n, BLOCK_K=depth, PRECISION=dot_precision(a), STEP_SCALE=fp8_step_scale(a),
        num_warps=t.warps, num_stages=t.stages)
    if split and counters is None:
        _sum_parts(parts, bias, out, t.n)
    return out


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor | None:
    """PB_FEWER_LAUNCHES (0950): the int32 counts of the parts each output tile of a chunked
    product has stored, zero between launches (each launch's last program of a tile sets its
    count back), one buffer a device and stream (a stream's launches run one after another).
    None without the knob, or for more tiles than the buffer holds: then pb_gemm_sum adds the
    parts in a second launch. The buffer is made at a stream's first chunked product; the engine
    runs eager steps before it captures graphs, so a graph replays with the same buffer."""
    if not LAST_SUM or tiles > COUNTERS:
        return None
    key = (device, torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0)
    counters = _counters.get(key)
    if counters is None:
        counters = _counters[key] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return counters


def router_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A router's float32 logits, hidden [T, H] @ weight [E, H]^T, as upstream's
    F.linear(hidden.float(), weight.float()) computes them. With the knob's registration in force
    and both operands bfloat16 or float16, the product runs on those operands with a float32 sum:
    each term is exact in float32 either way, so only the order and rounding of the sum differ,
    and the float32 copies of the weight and the hidden states are not made each step."""
    if (_library is not None and hidden.dtype == weight.dtype and hidden.dtype in (torch.bfloat16, torch.float16)
            and hidden.dim() == 2 and (hidden.is_cuda or INTERPRET)):
        return gemm(hidden, weight.t(), out_dtype=torch.float32)
    return torch.nn.functional.linear(hidden.type(torch.float32), weight.type(torch.float32))


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if not _supported(a, b):
        return torch.bmm(a.unsqueeze(0), b.unsqueeze(0)).squeeze(0)
    return gemm(a, b)


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, beta=1, alpha=1) -> torch.Tensor:
    if not _supported(a, b):
        return torch.baddbmm(bias.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), beta=beta, alpha=alpha).squeeze(0)
    if beta == 1 and alpha == 1 and bias.dtype == a.dtype and bias.dim() == 1 and bias.shape[0] == b.shape[1]:
        return gemm(a, b, bias.contiguous())  # F.linear's bias: added in float32 before the rounding
    product = gemm(a, b)
    if alpha != 1:
        product = product * alpha
    return torch.add(product, bias if beta == 1 else bias * beta)


def at_load() -> None:
    """The model-load hook: with the knob on, torch's mm and addmm become the kernels above."""
    global _library, TMA, LAST_SUM
    restore()
    LAST_SUM = TRITON and bool(knobs.get("PB_FEWER_LAUNCHES"))
    if LAST_SUM:
        sys.stderr.write("patchbay: PB_FEWER_LAUNCHES: a chunked product's parts are added by each tile's last "
                         "program, the attention's blocks counted in its kernel, keys and values cached in one "
                         "launch\n")
    if not on():
        return
    if not TRITON:
        sys.stderr.write("patchbay: PB_INVARIANT_GEMM: Triton is not installed; matrix products stay torch's\n")
        return
    library = torch.library.Library("aten", "IMPL")
    key = "CPU" if INTERPRET else "CUDA"
    library.impl("mm", _mm, key)
    library.impl("addmm", _addmm, key)
    _library = library
    sys.stderr.write(f"patchbay: PB_INVARIANT_GEMM: torch's mm and addmm on {key} tensors run as GEMMs whose "
                     "sums are fixed by the weight's shape, not the row count\n")
    if knobs.get("PB_GEMM_TMA"):
        TMA = True
        sys.stderr.write("patchbay: PB_GEMM_TMA: prompt-sized products read their operands through TMA descriptors\n")


def restore() -> None:
    """torch's own mm and addmm again (for in-process A/Bs and tests)."""
    global _library, TMA, LAST_SUM
    TMA = LAST_SUM = False
    if _library is not None:
        _library._destroy()
        _library = None

"""PB_KV_FP8 / PB_KV_INT8: the paged KV cache in 8 bits (e4m3, or int8 with 0840), with one
power-of-two scale a token and KV head.

Upstream keeps the cache in the model's dtype: in bfloat16 one token of one GLM-4.5-Air layer
costs 2 x 8 x 128 x 2 bytes (keys and values, 8 KV heads of 128). With the knob on, a cache row
(one token's keys, or its values, in one layer) holds its KV heads' elements as e4m3, each head
scaled by the smallest power of two that brings its largest magnitude to e4m3's largest finite
value (448) or below, followed by the heads' scales in float32, padded to 16 bytes: 8 x 128 + 32
bytes where bfloat16 takes 2,048, so the same memory holds 1.94 times the tokens (`row_bytes`).
The scales live inside the rows, so every copy of whole blocks as bytes (upstream's forks and
offloading, 0760's tail copies, 0790's host tier) carries them, and the pool is sized by the same
byte arithmetic as before.

A value is quantized once, where a step writes its new keys and values (`write_both`: one kernel
on a GPU, the bytes of `quantize`). The scales being powers of two, only the cast to e4m3 rounds:
a dequantized element (e4m3 times its scale) is exact in float32 and in bfloat16, and a scale may
be applied to a product instead of an element. Upstream's update (the path without 0750) reads
the rows back dequantized (`read`), a fresh prompt's own keys included. With 0750 the decode rows
read the e4m3 rows in the kernels (kernels/varlen_attention.py, KV_FP8) and the prompt rows read
their sequences' keys dequantized by `gather_prompts`; a step of fresh prompts reads back the
rows it has just written, like every other step. Either way every attention reads the cache's
rows, so a prompt computed cold and the same prompt resumed from the cache see the same keys, and
a token's rows depend on that token alone (batched == alone holds as with the bfloat16 cache).

PB_KV_INT8 (0840) keeps the same rows with int8 elements instead: the power of two is the
smallest that brings a head's largest magnitude to 127 or below, the scaled elements are rounded to
integers (to nearest, ties to even), and every statement above holds as written (an int8 times a
power of two is exact in bfloat16 too, and widens exactly to float16). Either knob turns the
cache on; with both, int8.

It changes output: e4m3 keeps 3 bits of mantissa (W58: mean |Δ logprob| 0.089 on air12-fp8),
int8 an element within 1/127 of its head's largest (W59: 0.047); both are above issue 27's gate of
0.02, so the knobs are opt-in. The cache views are made by upstream's full attention allocator
(its hooks call `bytes_per_page`, `views`, `write_both`, `read`); a sliding-window group keeps
the model's dtype.
"""

import sys

import torch

from .. import knobs
from .common import TRITON, kernels, pow2

ENABLED = False  # set by at_load: either knob on when the model was loaded
FP8 = torch.float8_e4m3fn
# A row element's format: its dtype, its largest magnitude written as m * 2**exponent, and m's
# 23 mantissa bits (what power_scales compares a head's largest magnitude with).
FORMATS = {"e4m3": (FP8, 448.0, 8, 0x600000),  # 448 = 1.75 * 2**8
           "int8": (torch.int8, 127.0, 6, 0x7E0000)}  # 127 = 1.984375 * 2**6
FORMAT = "e4m3"  # set by at_load: "int8" with PB_KV_INT8 (0840)
ALIGN = 16  # a row's bytes, and its scales' bytes, are multiples of this (TMA reads rows at 16-byte strides)


def on() -> bool:
    return bool(knobs.get("PB_KV_FP8") or knobs.get("PB_KV_INT8"))


def element() -> torch.dtype:
    """The dtype of a row's elements in the format loaded: e4m3, or int8 (0840)."""
    return FORMATS[FORMAT][0]


def scale_bytes(kv_heads: int) -> int:
    """The bytes a row's float32 scales take, padded to ALIGN."""
    return -(-4 * kv_heads // ALIGN) * ALIGN


def row_bytes(kv_heads: int, head_dim: int) -> int:
    """One cache row: the KV heads' 8-bit elements, then their scales."""
    return kv_heads * head_dim + scale_bytes(kv_heads)


def bytes_per_page(kv_heads: int, head_dim: int, page_size: int) -> int:
    """A full-attention page: page_size rows of keys, then page_size rows of values."""
    return 2 * page_size * row_bytes(kv_heads, head_dim)


def views(cache_bytes: torch.Tensor, rows: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cache's uint8 tensor as `rows` rows: (elements [rows, KV heads, dim] as uint8, scales
    [rows, KV heads] as float32), both views of the same bytes."""
    width = row_bytes(kv_heads, head_dim)
    table = cache_bytes[: rows * width].view(rows, width)
    data = table[:, : kv_heads * head_dim].unflatten(-1, (kv_heads, head_dim))
    scales = table[:, kv_heads * head_dim: kv_heads * head_dim + 4 * kv_heads].view(torch.float32)
    return data, scales


def power_scales(amax: torch.Tensor, fmt: str = "e4m3") -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest powers of two s with amax / s <= the format's largest magnitude (448 for e4m3,
    127 for int8), and 1 / s (float32, from amax's bits: exact; kernels/kv_fp8.py computes the same
    bits). A head of zeros gets 1."""
    _, _, top_exponent, top_mantissa = FORMATS[fmt]
    bits = amax.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127 - top_exponent + ((bits & 0x7FFFFF) > top_mantissa).to(torch.int32)
    exponent = exponent.clamp(-126, 126)
    scale = ((exponent + 127) << 23).view(torch.float32)
    inverse = ((127 - exponent) << 23).view(torch.float32)
    zero = amax == 0
    return torch.where(zero, 1.0, scale), torch.where(zero, 1.0, inverse)


def quantize(states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[tokens, KV heads, dim] -> (elements of FORMAT as uint8, float32 scales [tokens, KV heads]).
    Each head's scale is a power of two, so scaling is exact and only the rounding to the format
    rounds (to nearest, ties to even: the cast to e4m3, or to an integer for int8): a dequantized
    element, an e4m3 or an int8 times a power of two, is exact in bfloat16, and a kernel may apply
    the scale to a product instead of the element with the same bits."""
    dtype, top, _, _ = FORMATS[FORMAT]
    x = states.float()
    scales, inverse = power_scales(x.abs().amax(-1).contiguous(), FORMAT)
    y = (x * inverse[..., None]).clamp(-top, top)
    q = (y.round() if dtype == torch.int8 else y).to(dtype)
    return q.view(torch.uint8), scales


def dequantize(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Elements (as uint8) times their scales (exact in float32 and in bfloat16)."""
    return (q.view(element()).float() * scales[..., None]).to(dtype)


def write(data: torch.Tensor, scales: torch.Tensor, index: torch.Tensor, states: torch.Tensor) -> None:
    """A step's new keys (or values) [tokens, KV heads, dim] into the cache's rows `index`."""
    q, s = quantize(states)
    data.index_copy_(0, index, q)
    scales.index_copy_(0, index, s)


def write_both(cache: tuple, scales: tuple, index: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
    """A step's new keys and values [tokens, KV heads, dim] into their cache rows `index` (cache:
    the key and value rows, scales: theirs): one kernel on a GPU (kernels/kv_fp8.py, `quantize`'s
    bits; tests/test_kernels_gpu.py), `write` twice elsewhere. Not under Triton's interpreter: its
    cast to e4m3 drops the carry when a value rounds up to the next power of two (31.6 -> 16); int8
    rows take the same paths."""
    if not (TRITON and keys.is_cuda) or keys.shape[0] == 0:
        write(cache[0], scales[0], index, keys)
        write(cache[1], scales[1], index, values)
        return
    kv_heads, dim = keys.shape[1], keys.shape[2]
    assert cache[0].stride() == cache[1].stride() and scales[0].stride() == scales[1].stride()
    _, top, top_exponent, top_mantissa = FORMATS[FORMAT]
    kernels("kv_fp8").pb_kv_fp8_write[(keys.shape[0],)](
        keys, values, cache[0].view(element()), cache[1].view(element()), scales[0], scales[1], index,
        keys.stride(0), keys.stride(1), values.stride(0), values.stride(1), cache[0].stride(0), scales[0].stride(0),
        KV_HEADS=kv_heads, HEAD_DIM=dim, BLOCK_H=pow2(kv_heads), TOP=top, TOP_EXPONENT=top_exponent,
        TOP_MANTISSA=top_mantissa, INT8=FORMAT == "int8", num_warps=4)


def gather_prompts(keys: torch.Tensor, values: torch.Tensor, scales: tuple, index: torch.Tensor, cu_q: torch.Tensor,
                   cu_k: torch.Tensor, dtype: torch.dtype, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """With 0750: the keys and values of the step's sequences of more than one query token,
    dequantized to `dtype` into [1, KV heads, keys, dim] tensors laid out as upstream's gather
    (sequence s's j-th key at cu_k[s] + j; a decode row's keys are left unwritten), for the prompt
    kernel: in its blocks of 128 x 128 a conversion of each element costs more than the gather.
    `keys`, `values`: the cache's 8-bit rows [rows, KV heads, dim] (as element()); the grid is
    fixed by the step's padded sizes (CUDA graphs), its programs for decode rows return at once."""
    tokens, kv_heads, dim = index.numel(), keys.shape[1], keys.shape[2]
    out_k = torch.empty((tokens, kv_heads, dim), dtype=dtype, device=keys.device)
    out_v = torch.empty_like(out_k)
    sequences = cu_q.numel() - 1
    if tokens and sequences:
        kernels("kv_fp8").pb_kv_fp8_gather[(tokens // block + sequences,)](
            keys, values, scales[0], scales[1], out_k, out_v, index, cu_q, cu_k, sequences, keys.stride(0),
            scales[0].stride(0), out_k.stride(0), KV_HEADS=kv_heads, HEAD_DIM=dim, BLOCK=block, SEQ_CHUNK=64,
            num_warps=4)
    return out_k.transpose(0, 1).unsqueeze(0), out_v.transpose(0, 1).unsqueeze(0)


def read(data: torch.Tensor, scales: torch.Tensor, index: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The cache's rows `index`, dequantized: [len(index), KV heads, dim] in `dtype`."""
    return dequantize(data.index_select(0, index), scales.index_select(0, index), dtype)


def at_load() -> None:
    global ENABLED, FORMAT
    ENABLED = on()
    FORMAT = "int8" if knobs.get("PB_KV_INT8") else "e4m3"
    if not ENABLED:
        return
    knob = "PB_KV_INT8" if FORMAT == "int8" else "PB_KV_FP8"
    also = " (PB_KV_FP8 is on too: int8 is used)" if FORMAT == "int8" and knobs.get("PB_KV_FP8") else ""
    sys.stderr.write(f"patchbay: {knob}: the KV cache holds {FORMAT} values with a float32 scale a token and KV "
                     f"head{also}\n")


def restore() -> None:
    global ENABLED, FORMAT
    ENABLED, FORMAT = False, "e4m3"

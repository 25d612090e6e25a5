"""PB_GRAPH_BUCKETS: CUDA-graph shapes that follow the batch instead of fixed wide intervals.

With CUDA graphs on the varlen path (every attention implementation without a decode fast
path, e.g. sdpa), upstream pads each step's query tokens up to a multiple of 64 and the KV
tokens it reads up to a multiple of 16,384, so that a few graphs serve every step. A decode
step of one request then runs the whole model on 64 rows and gathers, masks and attends
over 16K cache slots per layer: on an H200 that padding is most of the step.

Here the padded sizes are buckets that grow with the size they hold: query tokens round up
to a power of two up to 64 and to 1/8 of an octave above (at most 12.5 % padding), KV
tokens to 1/4 of an octave (at most 25 %), so the work is near the batch's own and the
number of distinct graphs grows with the logarithm of the sizes seen. A step that reads no
cache (a first prefill) stays at zero KV tokens instead of 16K.
"""

from .. import knobs

Q_POW2_UNTIL = 64  # query sizes up to this round to a power of two (decode batches)
Q_PARTS = 8  # above it, to 1/8 of an octave (prefill chunks)
KV_PARTS = 4  # KV reads round to 1/4 of an octave
KV_FLOOR = 256  # the smallest KV bucket: one full-attention page


def on() -> bool:
    return bool(knobs.get("PB_GRAPH_BUCKETS"))


def round_up(n: int, parts: int) -> int:
    """The smallest m * 2**e >= n with m < 2 * parts (parts a power of two): sizes up to
    2 * parts stay exact, larger ones waste less than 1 / parts."""
    if n <= 0:
        return 0
    shift = max(0, (n - 1).bit_length() - parts.bit_length())
    return -(-n >> shift) << shift


def pad(num_q_tokens: int, max_kv_read: int, max_q: int, max_kv: int) -> tuple[int, int]:
    """The padded (query tokens, KV tokens read) of a varlen step, capped like upstream's."""
    if num_q_tokens <= Q_POW2_UNTIL:
        q = round_up(num_q_tokens, 1)
    else:
        q = round_up(num_q_tokens, Q_PARTS)
    kv = 0 if max_kv_read <= 0 else round_up(max(max_kv_read, KV_FLOOR), KV_PARTS)
    return min(max(q, 1), max_q), min(kv, max_kv)

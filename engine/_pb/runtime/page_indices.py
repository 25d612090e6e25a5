"""PB_PAGE_INDICES: a step's cache read indices made from each request's pages, not token by token.

On the varlen path a step reads each request's whole cache through an index per cached token:
upstream builds every request's list of them in Python (one `range` a page, then `extend`) and
turns the step's list into a tensor, both once per token of context, every step. Under 32 agent
streams of ~850-token contexts that is some 27,000 Python ints a step (3.9 ms on a 2-core CPU,
W28's host-bench), held under the interpreter lock while the event loop and the GPU wait, and it
grows with the context. With the knob on, a step keeps, per
attention group, the physical block of each page it reads and how many of that page's tokens,
and writes the indices into the host's index storage with a few array operations at the end.
The indices are upstream's, value for value, so the bits are too. Groups whose allocator is not
upstream's full-attention one (a sliding window) keep upstream's lists.
Hooks: where a step creates its read accumulators, where the cache extends them, and where they
become the index tensor.
"""

import numpy as np
import torch

from .. import knobs


def on() -> bool:
    return bool(knobs.get("PB_PAGE_INDICES"))


class Pages:
    """One attention group's read indices for a step, as pages: each page's block, and how many
    of its tokens are read (all of them but maybe the last of a request's)."""

    __slots__ = ("blocks", "lengths", "stride", "total")

    def __init__(self):
        self.blocks: list[int] = []
        self.lengths: list[int] = []
        self.stride = 0  # the allocator's physical stride of a block, the same for all its pages
        self.total = 0

    def __len__(self) -> int:
        return self.total

    def add(self, allocator, request_id: str, past_length: int, query_length: int) -> None:
        """The pages `allocator.get_read_indices` would list for this request."""
        table = allocator.block_table.get(request_id)
        if table is None:
            raise ValueError(f"No block table found for request {request_id}")
        total = past_length + query_length
        per_page = allocator.tokens_per_page
        full, rest = divmod(total, per_page)
        self.blocks.extend(table[: full + (1 if rest else 0)])
        self.lengths.extend([per_page] * full)
        if rest:
            self.lengths.append(rest)
        self.stride = allocator.block_physical_stride
        self.total += total

    def indices(self) -> np.ndarray:
        """The step's read indices, int64: for each page in order, block * stride + 0 .. length-1."""
        lengths = np.asarray(self.lengths, dtype=np.int64)
        starts = np.asarray(self.blocks, dtype=np.int64) * self.stride
        page_begins = np.cumsum(lengths) - lengths  # where each page's run begins in the output
        return np.repeat(starts - page_begins, lengths) + np.arange(self.total, dtype=np.int64)


def accumulators(cache, groups: int) -> list | None:
    """A step's read accumulators, one Pages a group, when the knob is on and every group is
    plain full attention; None when upstream's lists apply."""
    from ...generation.continuous_batching.cache_allocators.full_attention import FullAttentionCacheAllocator

    if not on() or any(type(a) is not FullAttentionCacheAllocator for a in cache.cache_allocators.values()):
        return None
    return [Pages() for _ in range(groups)]


def extend(allocator, read_indices, request_id: str, past_length: int, query_length: int) -> bool:
    """Add a request's reads to a Pages accumulator; False for upstream's list."""
    if not isinstance(read_indices, Pages):
        return False
    read_indices.add(allocator, request_id, past_length, query_length)
    return True


def fill(row: torch.Tensor, read_indices) -> bool:
    """Write a Pages accumulator's indices into row[:len] (the step's index storage for its
    group); False for upstream's list."""
    if not isinstance(read_indices, Pages):
        return False
    if read_indices.total:
        row[: read_indices.total].copy_(torch.from_numpy(read_indices.indices()))
    return True

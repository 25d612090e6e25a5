"""W28 host-bench: one step's cache read indices built as upstream builds them (a Python list per
request, then one tensor) against 0700's pages (PB_PAGE_INDICES), on the CPU, with the patched
engine first on PYTHONPATH. Decode steps: every request reads its whole context plus the one new
token. Air12's geometry: one full-attention group of 12 layers, 256-token pages. Checks that both
give the same indices, then prints the median time of each over `reps` steps.
Usage: PYTHONPATH=build/engines/pb-… python bench_indices.py [reps]"""

import random
import statistics
import sys
import time

import torch
from transformers.generation.continuous_batching.cache_allocators.full_attention import FullAttentionCacheAllocator
from transformers._pb.runtime.page_indices import Pages

PAGE, LAYERS = 256, 12
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 200

allocator = FullAttentionCacheAllocator.__new__(FullAttentionCacheAllocator)
allocator._before_cache_tensor_init(index=0, layer_indices=list(range(LAYERS)), tokens_per_page=PAGE,
                                    bytes_per_page=1, allow_block_sharing=False)


def upstream(requests):
    indices = []
    for rid, past in requests:
        indices.extend(allocator.get_read_indices(rid, past, 1))
    return torch.tensor(indices, dtype=torch.int64)


def pages(requests, row):
    acc = Pages()
    for rid, past in requests:
        acc.add(allocator, rid, past, 1)
    row[: acc.total].copy_(torch.from_numpy(acc.indices()))
    return row[: acc.total]


def median_us(fn):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


rng = random.Random(0)
print(f"{'requests':>8} {'context':>8} {'indices':>8} {'upstream us':>12} {'pages us':>9} {'ratio':>6}")
for n, context in ((16, 860), (32, 860), (32, 1420), (4, 8000), (16, 8000)):
    allocator.block_table.clear()
    free = list(range(4096))
    rng.shuffle(free)
    requests = []
    for r in range(n):
        past = context + rng.randrange(-40, 40)
        allocator.block_table[f"r{r}"] = [free.pop() for _ in range((past + 1 + PAGE - 1) // PAGE)]
        requests.append((f"r{r}", past))
    row = torch.empty(n * (context + 64), dtype=torch.int64)
    want = upstream(requests)
    assert torch.equal(pages(requests, row), want), "pages differ from upstream's indices"
    up, mine = median_us(lambda: upstream(requests)), median_us(lambda: pages(requests, row))
    print(f"{n:>8} {context:>8} {len(want):>8} {up:>12.0f} {mine:>9.0f} {up / mine:>6.1f}")

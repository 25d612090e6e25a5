"""PB_PARTIAL_EVICT: under memory pressure, the oldest cached blocks go, not every one of them.

Upstream keeps the whole blocks it has hashed after their requests finish, for later prompts
that start the same way. When the free share of the pool falls under the scheduler's safety
margin (0.15 for the FIFO scheduler) it evicts every cached block at once. A server that has
served a few long conversations reaches the margin on its cached blocks alone, so the next
request wipes the cache, the conversation in progress included.

With the knob on, the margin is met by giving back only as many blocks as it needs, plus
HEADROOM of the pool so the next steps do not evict again at once: first the prompts' tails
0760 holds, then cached blocks from the least recently used (upstream's ledger keeps them in
the order their last request let go of them). The same holds where upstream's offloading, about
to offload a request for others that could not be given blocks, first evicts every cached
block: only what those requests need goes (with nothing starved, every cached block still
goes, as upstream does). The blocks a request let go of together are taken from the start of
that run, so the prompt a partly evicted run belonged to is not found again, and its remaining
blocks are the next to go. The cache's contents are never changed, only which blocks stay
findable: same bits.

Rejected (W44): on one H200, 64 conversations growing from 600 tokens on 480 pages found nothing
cached at their third and fourth turns with or without it (the live requests oversubscribe that
pool and are offloaded), and keeping more cached blocks left less room: x0.989 with the margin
hook, x0.933 with both.
"""

from itertools import islice
from math import ceil

from .. import knobs
from . import tail_reuse

HEADROOM = 0.05  # of the pool, freed beyond the margin


def on() -> bool:
    return bool(knobs.get("PB_PARTIAL_EVICT"))


def evict_cached_blocks(cache, margin: float) -> bool:
    """The scheduler under its safety margin: upstream's eviction of every cached block, or with
    the knob on (and one allocator, as full attention has) only what the margin needs. True
    when any block went back to the pool."""
    if not on() or len(cache.cache_allocators) != 1:
        return cache.evict_cached_blocks()
    total = cache.num_sectors * cache.bytes_per_sector
    return _evict(cache, lambda: (margin + HEADROOM) * total - cache.compute_free_capacity(relative=False))


def evict_for_starved(cache, starved: list) -> bool:
    """Upstream's offloading, before it offloads a request: every cached block goes, or with the
    knob on only what the starved requests (state, new tokens) need, plus HEADROOM. Without
    starved requests (no request could be scheduled at all) every cached block still goes."""
    if not on() or len(cache.cache_allocators) != 1 or not starved:
        return cache.evict_cached_blocks()
    allocator = next(iter(cache.cache_allocators.values()))
    needed = sum(allocator.needs_new_blocks(state.request_id, state.current_len(), length) for state, length in starved)
    total = cache.num_sectors * cache.bytes_per_sector
    return _evict(cache, lambda: needed * allocator.bytes_per_block + HEADROOM * total
                  - cache.compute_free_capacity(relative=False))


def _evict(cache, short) -> bool:
    """Gives back 0760's tails, then the least recently used cached blocks, while `short()` (the
    bytes still missing) is positive. True when any block went back to the pool."""
    if short() <= 0:
        return False
    evicted = tail_reuse.drop(cache)
    missing = short()
    if missing <= 0:
        return True
    allocator = next(iter(cache.cache_allocators.values()))
    ledger = allocator.ledger
    victims = list(islice(ledger.cached_blocks, ceil(missing / allocator.bytes_per_block)))
    for block in victims:
        del ledger.cached_blocks[block]
        del ledger.hash_to_block[ledger.block_to_hash.pop(block)]
    if victims:
        cache.pool.free_blocks(allocator.index, victims)
    return evicted or bool(victims)

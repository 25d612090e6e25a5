"""PB_TAIL_REUSE: a resent prompt recomputes two tokens, not the part of a block past its last
whole one.

Upstream's prefix cache reuses whole blocks only (256 tokens here), found by hash. A prompt
sent again therefore recomputes everything after its last whole block: up to 255 tokens, a
full MoE step that touches nearly every expert (on one H200, a resent 9,101-token prompt
recomputed 141 tokens: about 20 ms of its 32 ms first token, W41).

With the knob on, a request that finishes normally leaves the block holding its prompt's end
(the part past the last whole block) to a small registry instead of the pool, filed under the
hash of the whole blocks before it (several prompts may leave one each there). A later prompt
whose whole blocks match up to there adopts, of the blocks filed there, the one whose tokens go
on as the prompt does the longest: the tokens they share are cached (when they are all the tail
could give, or MIN_SHARED tokens at least: a tail is not used up on a chat template's opening),
and only the rest is computed. Two tokens are always left to compute, so the last prompt row
runs through the prompt attention kernel as in a cold run (a lone row would go to the decode
kernel, which rounds otherwise).

What is reused is exactly what a cold run computes:

- only prompt positions: the finished request's prompt rows were computed by prefill; its reply
  rows (decoded one at a time) are never offered;
- the block moves to the new request, which writes its own rows past the shared ones; the rows
  a step still in flight for the old request writes (async batching) lie past its prompt and
  land before the new request's step on the same stream;
- the block itself is offered only when it is the request's last and has no hash (no other
  request refers to it). When the reply ran past it (the block then is a whole block, hashed
  with reply tokens, that upstream keeps for its own reuse) or another request shares it, a copy
  is offered instead: made on the compute stream, after the step in flight and before any step
  that reads it. Agents' replies are often longer than what is left of their prompt's last
  block, so without the copy most retries would find only whole blocks.

The registry is bounded (MAX_TAILS, least recently left first out), takes no block while less
than FREE_FLOOR of the pool is free or merely cached (at 64 agent conversations on one H200 the
pool was oversubscribed, and held tails cost about 3 % of the aggregate, W42), and gives every
block back when the cache is short of memory (upstream's eviction of its cached blocks) or reset.
It serves a cache with a single allocator (full attention, as GLM-4.5's); others are left as
they are.

On one H200 (W42, before the copy) an 8K replay's first token went from 31 to 23 ms and a 32K
one's from 53 to 49 ms.
"""

from collections import OrderedDict

from .. import knobs

MAX_TAILS = 64  # blocks held for prompts' ends; the oldest goes back to the pool first
KEEP_COMPUTED = 2  # prompt tokens always computed again, so the last row is a prompt row
FREE_FLOOR = 0.25  # a tail is held only while requests hold less than the rest of the pool: not when they wait for blocks
MIN_SHARED = 32  # a tail is used up only for this many of its tokens, or all of them: not for a template's opening
_FIRST = -1  # the key of a tail in a prompt's first block (no whole block before it)


def on() -> bool:
    return bool(knobs.get("PB_TAIL_REUSE"))


class Tails:
    """The held blocks: each with its key (the hash of the whole blocks before it) and the prompt
    tokens it holds, in the order they were left (the oldest first)."""

    def __init__(self):
        self.blocks: OrderedDict = OrderedDict()  # block id -> (key, tokens)
        self.by_key: dict = {}  # key -> the block ids filed under it

    def add(self, key, block: int, tokens: tuple) -> list[int]:
        """Hold `block`; returns the blocks let go: the same prompt's older tail, the oldest past MAX_TAILS."""
        gone = [b for b in self.by_key.get(key, ()) if self.blocks[b][1] == tokens]
        for b in gone:
            self.take(b)
        self.blocks[block] = (key, tokens)
        self.by_key.setdefault(key, []).append(block)
        while len(self.blocks) > MAX_TAILS:
            gone.append(next(iter(self.blocks)))
            self.take(gone[-1])
        return gone

    def best(self, key, rest: list[int], limit: int) -> tuple[int | None, int]:
        """The block under `key` whose tokens share the longest start with `rest` (at most `limit`)."""
        found, most = None, 0
        for block in self.by_key.get(key, ()):
            tokens = self.blocks[block][1]
            n, top = 0, min(limit, len(tokens))
            while n < top and tokens[n] == rest[n]:
                n += 1
            if n > most:
                found, most = block, n
        return found, most

    def take(self, block: int) -> None:
        key, _ = self.blocks.pop(block)
        self.by_key[key].remove(block)
        if not self.by_key[key]:
            del self.by_key[key]


def _tails(cache) -> Tails:
    tails = getattr(cache, "_pb_tails", None)
    if tails is None:
        tails = cache._pb_tails = Tails()
    return tails


def _allocator(cache):
    if not on() or not cache.use_prefix_sharing or len(cache.cache_allocators) != 1:
        return None
    return next(iter(cache.cache_allocators.values()))


def keep(cache, state, stream=None) -> None:
    """update_batch, before a request that finished normally frees its blocks: the block holding
    its prompt's end goes to the registry when the prompt ends inside a block. The block itself
    moves when it is the request's last, unhashed and unshared; otherwise (the reply ran past it,
    which makes it a whole block hashed with reply tokens, or another request refers to it) a copy
    of it goes, made on `stream` (the compute stream, where the step in flight runs before it)."""
    allocator = _allocator(cache)
    if allocator is None:
        return
    table = allocator.block_table.get(state.request_id)
    prompt = state.initial_tokens
    page = allocator.tokens_per_page
    end = len(prompt) // page  # the block holding the prompt's end
    if not table or len(prompt) % page == 0 or len(table) <= end:
        return
    if _unheld_share(cache, allocator) < FREE_FLOOR:
        return
    ledger = allocator.ledger
    if end == 0:
        key = _FIRST
    else:
        key = ledger.block_to_hash.get(table[end - 1])
        if key is None:  # the whole blocks before it were never registered: nothing finds it
            return
    block = table[end]
    if len(table) == end + 1 and block not in ledger.block_to_hash and block not in ledger.shared_ref_counts:
        table.pop()
    else:
        block = _copy(cache, allocator, block, stream)
        if block is None:
            return
    gone = _tails(cache).add(key, block, tuple(prompt[end * page:]))
    if gone:
        cache.pool.free_blocks(allocator.index, gone)


def _unheld_share(cache, allocator) -> float:
    """The share of the pool no request holds: free, or cached by upstream for reuse (given back
    at once under memory pressure, as held tails are). Cached blocks fill the pool of a server
    that has run a while; counting them as held would keep every tail out."""
    cached = len(allocator.ledger.cached_blocks) * allocator.bytes_per_block
    return (cache.compute_free_capacity(relative=False) + cached) / (cache.num_sectors * cache.bytes_per_sector)


def _copy(cache, allocator, block: int, stream) -> int | None:
    """A free block holding what `block` holds (its rows past the prompt are never read: an
    adopting request writes its own there first), or None when the pool has none to give."""
    from ...generation.continuous_batching.utils import stream_context

    pool = cache.pool
    if pool.count_free_blocks(allocator.index) == 0:
        if pool.num_free_sectors == 0:
            return None
        pool.allocate_sector(allocator.index)
    fresh = pool.get_free_blocks(allocator.index, 1)[0]
    with stream_context(stream):  # one row of the byte view: no index tensor to send from the host first
        allocator._copy_view[fresh].copy_(allocator._copy_view[block], non_blocking=True)
    return fresh


def adopt(cache, request_id: str, prompt_ids: list[int], prefix_len: int) -> int:
    """search_prefix_match, after the whole blocks matched (`prefix_len` tokens): of the tails
    held after them, the one that goes on as the prompt does the longest moves to the request.
    Returns the tokens now cached."""
    allocator = _allocator(cache)
    if allocator is None:
        return prefix_len
    whole = prefix_len // allocator.tokens_per_page
    if whole == 0:
        key = _FIRST
    else:
        key = allocator.ledger.block_to_hash.get(allocator.block_table[request_id][whole - 1])
    tails = _tails(cache)
    rest = prompt_ids[prefix_len:]
    limit = len(rest) - KEEP_COMPUTED
    block, shared = tails.best(key, rest, limit)
    if block is None or shared < min(MIN_SHARED, len(tails.blocks[block][1]), limit):
        return prefix_len
    tails.take(block)
    allocator.block_table.setdefault(request_id, []).append(block)
    return prefix_len + shared


def drop(cache) -> bool:
    """Memory pressure or a reset: every held block goes back to the pool. True when any did."""
    tails = getattr(cache, "_pb_tails", None)
    if tails is None or not tails.blocks:
        return False
    allocator = next(iter(cache.cache_allocators.values()))
    cache.pool.free_blocks(allocator.index, list(tails.blocks))
    cache._pb_tails = Tails()
    return True

"""PB_HOST_TIER_MB: whole blocks the prefix cache gives up under memory pressure are kept in
host memory, and a later prompt that starts with them gets them back by copy instead of
computing them again.

Upstream keeps a whole block (256 tokens of every layer's keys and values) after its request
ends, findable by the hash of its tokens and of every token before it, until the pool runs
short; then every such block goes at once (`evict_cached_blocks`). An agent's conversation that
sat idle while others ran is computed again from its first token when it comes back: a 32K
prompt is a full prefill, where copying its keys and values from pinned host memory moves about
1.6 GB (air12 bf16) over PCIe.

With the knob set to a size in MiB, a table of that much pinned host memory is allocated when
the engine starts, in slots of one block each (at most half the memory the host has available
then, over its local ranks; a smaller table is said on stderr):
- eviction: before upstream gives a cached block back to the pool, its bytes are copied to a
  slot, filed under its hash, unless a slot already holds that hash (it is then only marked as
  recently used). A full table reuses its least recently used slot.
- a prompt's arrival (`search_prefix_match`, before upstream's match): the prompt's whole blocks
  are hashed as upstream hashes them, in order. After those the pool still has, the ones the
  table holds are copied back into free blocks of the pool and registered as upstream's cached
  blocks, up to the first block found in neither. Upstream's match then finds them. When the
  pool has too few free blocks, upstream's own eviction runs first (the request would need that
  room to compute the blocks anyway); the evicted blocks go to the table.

Every copy is queued on the compute stream, where the step in flight runs before it and the
next step after it, so the host never waits for one and no block is read before its bytes have
landed, nor written before they have left. The slots hold exact bytes: a block brought back is
the block the pool held, so replies are those a prompt whose blocks never left would get.

It serves allocators that share blocks (full attention, as GLM-4.5's); others are left alone.
Both ranks of a tensor-parallel pair keep their own shard and make the same choices (the same
hashes in the same order). The table is cleared with upstream's ledgers (a reset). Tails held
by 0760 and blocks given back by 0780 (rejected) do not go to the table. `/metrics` counts the
blocks saved, brought back and dropped, and the blocks held (`pb_host_tier_*`).
"""

import os
import sys
from collections import OrderedDict

import torch

from .. import knobs

MIB = 1 << 20


def size_mib() -> int:
    return int(knobs.get("PB_HOST_TIER_MB") or 0)


def local_ranks() -> int:
    """The ranks on this host: LOCAL_WORLD_SIZE where a launcher sets it, every rank where they
    meet on a loopback address (a pair on one machine), else one."""
    env = os.environ
    count = env.get("LOCAL_WORLD_SIZE")
    if count is None and env.get("MASTER_ADDR") in ("127.0.0.1", "localhost", "::1"):
        count = env.get("WORLD_SIZE")
    try:
        return max(1, int(count or 1))
    except ValueError:
        return 1


def host_room_mib() -> int | None:
    """The most a table may take on this host: half of the memory available now, shared by the
    ranks on it, so a size meant for a serving node (preflight checks it there) cannot exhaust a
    smaller machine. None where the host does not say."""
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return None
    return kib // 1024 // 2 // local_ranks()


class Table:
    """One allocator's slots: pinned host rows of one block each, filed by block hash (the least
    recently used first)."""

    def __init__(self, allocator, slots: int, pinned: bool):
        # resident from the start (pinned pages are; plain ones are written once here), so the
        # process's memory does not grow as the table fills
        shape = (slots, allocator.bytes_per_block)
        if pinned:
            self.rows = torch.empty(shape, dtype=torch.uint8, pin_memory=True)
        else:
            self.rows = torch.zeros(shape, dtype=torch.uint8)
        self.free = list(range(slots - 1, -1, -1))
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # block hash -> slot
        self.saved = self.restored = self.dropped = 0

    def slot_for(self, block_hash: int) -> int:
        """A slot for a new hash: a free one, else the least recently used one's."""
        if self.free:
            slot = self.free.pop()
        else:
            _, slot = self.slot_of.popitem(last=False)
            self.dropped += 1
        self.slot_of[block_hash] = slot
        return slot

    def clear(self) -> None:
        self.free = list(range(self.rows.shape[0] - 1, -1, -1))
        self.slot_of.clear()


def attach(cache, stream) -> None:
    """The batch processor's start: with the knob set, a table for each allocator that shares
    blocks, and the stream every copy is queued on (None on the CPU). A processor made again
    over the same cache keeps the tables."""
    cache._pb_host_stream = stream
    if getattr(cache, "_pb_host_tables", None) is not None:
        return
    cache._pb_host_tables = {}
    mib = size_mib()
    if not mib or not cache.use_prefix_sharing:
        return
    pinned = cache.device.type == "cuda"
    sharing = [a for a in cache.cache_allocators.values() if a.use_block_sharing]
    room = host_room_mib()
    if room is not None and mib > room:
        sys.stderr.write(f"patchbay: PB_HOST_TIER_MB: {mib} MiB asked, but this host has {room} MiB to spare for "
                         f"it (half its available memory over its {local_ranks()} local rank(s)): {room} MiB\n")
        mib = room
    for allocator in sharing:
        slots = mib * MIB // len(sharing) // allocator.bytes_per_block
        if slots > 0:
            cache._pb_host_tables[allocator.index] = Table(allocator, slots, pinned)
    tables = cache._pb_host_tables.values()
    sys.stderr.write(f"patchbay: PB_HOST_TIER_MB: {sum(t.rows.numel() for t in tables) / MIB:.0f} MiB of host "
                     f"memory keep evicted prefix blocks ({sum(t.rows.shape[0] for t in tables)} blocks"
                     f"{', pinned' if pinned else ''})\n")


def _stream(cache):
    from ...generation.continuous_batching.utils import stream_context

    return stream_context(getattr(cache, "_pb_host_stream", None))


def save(cache, allocator, blocks) -> None:
    """evict_cached_blocks, before the ledger forgets `blocks` (unreferenced, hashed): each one's
    bytes go to a slot unless the table holds its hash already."""
    table = (getattr(cache, "_pb_host_tables", None) or {}).get(allocator.index)
    if table is None or not blocks:
        return
    hashes = allocator.ledger.block_to_hash
    copies = []
    for block in blocks:
        block_hash = hashes.get(block)
        if block_hash is None:
            continue
        if block_hash in table.slot_of:
            table.slot_of.move_to_end(block_hash)
            continue
        copies.append((block, table.slot_for(block_hash)))
    if not copies:
        return
    with _stream(cache):
        for block, slot in copies:
            table.rows[slot].copy_(allocator._copy_view[block], non_blocking=True)
    table.saved += len(copies)


def _wanted(allocator, table: Table, prompt_ids: list[int], hashes: list[int]) -> list[int]:
    """The hashes to bring back: after the pool's own blocks, those the table holds, up to the
    first block found in neither (upstream's match stops there). The prompt's whole blocks are
    hashed as upstream hashes them, one at a time and only as far as the walk goes (a new
    prompt's first block is in neither); `hashes` keeps those made for a second walk."""
    from ...generation.continuous_batching.cache_allocators.cache_allocator import compute_block_hash

    page, in_pool, wanted = allocator.tokens_per_page, allocator.ledger.hash_to_block, []
    for b in range((len(prompt_ids) - 1) // page):
        if b == len(hashes):
            hashes.append(compute_block_hash(hashes[-1] if hashes else None, prompt_ids[b * page:(b + 1) * page]))
        block_hash = hashes[b]
        if block_hash in in_pool:
            if wanted:  # the match would stop at the first missing block anyway
                break
            continue
        if block_hash not in table.slot_of:
            break
        wanted.append(block_hash)
    return wanted


def _free_blocks(cache, allocator) -> int:
    """Blocks the allocator can take without evicting: its free blocks and whole free sectors."""
    return cache.pool.count_free_blocks(allocator.index) + cache.pool.num_free_sectors * allocator.blocks_per_sector


def restore(cache, prompt_ids: list[int]) -> None:
    """search_prefix_match, before upstream's match: the prompt's blocks the table holds go back
    into the pool as cached blocks, after those the pool holds."""
    tables = getattr(cache, "_pb_host_tables", None)
    if not tables:
        return
    for allocator in cache.cache_allocators.values():
        table = tables.get(allocator.index)
        if table is None or not table.slot_of:  # nothing saved yet: no hashing on the way in
            continue
        hashes: list[int] = []
        wanted = _wanted(allocator, table, prompt_ids, hashes)
        if not wanted:
            continue
        if _free_blocks(cache, allocator) < len(wanted):
            cache.evict_cached_blocks()  # upstream's own answer to a short pool; what it evicts goes to the table
            wanted = _wanted(allocator, table, prompt_ids, hashes)
        count = min(len(wanted), _free_blocks(cache, allocator))
        if count == 0:
            continue
        pool, ledger = cache.pool, allocator.ledger
        while pool.count_free_blocks(allocator.index) < count:
            pool.allocate_sector(allocator.index)
        blocks = pool.get_free_blocks(allocator.index, count)
        with _stream(cache):
            for block, block_hash in zip(blocks, wanted):
                table.slot_of.move_to_end(block_hash)
                allocator._copy_view[block].copy_(table.rows[table.slot_of[block_hash]], non_blocking=True)
                ledger.register_new_hash(block, block_hash)
                ledger.cached_blocks[block] = None
        table.restored += count


def clear(cache) -> None:
    """A reset of upstream's ledgers: every slot is free again."""
    for table in (getattr(cache, "_pb_host_tables", None) or {}).values():
        table.clear()


def stats(cache) -> dict | None:
    """The counters /metrics shows, summed over the tables (None without any)."""
    tables = list((getattr(cache, "_pb_host_tables", None) or {}).values())
    if not tables:
        return None
    return {"saved": sum(t.saved for t in tables), "restored": sum(t.restored for t in tables),
            "dropped": sum(t.dropped for t in tables), "held": sum(len(t.slot_of) for t in tables),
            "slots": sum(t.rows.shape[0] for t in tables)}

"""0790 PB_HOST_TIER_MB: whole prefix blocks evicted under memory pressure are kept in host
memory and copied back for a later prompt that starts with them.

A pool of 24 blocks (256 tokens each): three prompts of four to six blocks leave their blocks
cached, then a prompt of about nine blocks needs room and upstream evicts every cached block.
The first prompt sent again then finds nothing with the knob unset; with it set its whole
blocks come back from host memory, and its replies (greedy and seeded) are those it got before
the eviction, and a reply decoding meanwhile is the one it gets alone. `/metrics` counts what was
saved and restored. A tensor-parallel pair (CPU, gloo) brings back the same blocks on both ranks
and replies as one process does.
"""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from patchbay.runtime.models import model_path

from .conftest import ALL_ON, LOCAL, Server, engine_module, free_port, metric
from .test_partial_evict import TEXT, pressure_prompts
from .test_prefix_reuse import ask, prompt_ids

pytestmark = pytest.mark.engine

SEEDED = {"temperature": 0.8, "top_p": 0.95, "seed": 5}
# long enough to be decoding still when the long prompt evicts: a tensor-parallel pair on the CPU
# decodes several times slower than one process, prompts and replies alike, so it needs fewer
SIDE_TOKENS = {1: 512, 2: 256}


@pytest.fixture(scope="module")
def runs(patched_engine, tmp_path_factory):
    """For the knob unset, set to 4 MiB (64 blocks of the tiny model), and set so on a
    tensor-parallel pair (each rank its own shard and table): the first prompt's replies and
    cached counts before the eviction and after it, and the host tier's counters."""
    got = {}
    for arm in ("0", "4", "4-tp2"):
        mib, tp = arm.split("-")[0], 2 if arm.endswith("tp2") else 1
        knobs = {**ALL_ON, "PB_HOST_TIER_MB": mib, **({"PB_TENSOR_PARALLEL": "1"} if tp == 2 else {})}
        s = Server(patched_engine, model_path(LOCAL), knobs, tmp_path_factory.mktemp(f"run-host-{arm}"),
                   tp=tp, rdzv_port=free_port(), engine_args="--cb-num-blocks 24 --cb-max-batch-tokens 1024")
        try:
            prompts, long = pressure_prompts("Host tier")
            lengths = [len(prompt_ids(s, p)) for p in [*prompts, long]]
            side = f"Host tier (side).\n{TEXT[40000:41000]}"
            alone = ask(s, side, max_tokens=SIDE_TOKENS[tp])
            before = [ask(s, prompts[0]), ask(s, prompts[0], **SEEDED)]
            with ThreadPoolExecutor(1) as pool:  # a reply decoded while blocks are evicted, saved, restored
                beside = pool.submit(lambda: (ask(s, side, max_tokens=SIDE_TOKENS[tp]), time.monotonic()))
                for p in prompts[1:]:
                    ask(s, p, max_tokens=4)
                long_sent = time.monotonic()
                ask(s, long, max_tokens=4)
                after = [ask(s, prompts[0]), ask(s, prompts[0], **SEEDED)]
                beside, beside_done = beside.result()
            counters = {k: metric(s, f"pb_host_tier_{k}_blocks_total") for k in ("saved", "restored", "dropped")}
            counters["held"] = metric(s, "pb_host_tier_held_blocks")
            got[arm] = {"lengths": lengths, "before": before, "after": after, "counters": counters,
                        "alone": alone, "beside": beside, "overlapped": beside_done > long_sent}
        finally:
            s.stop()
    return got


def test_the_prompts_need_more_than_the_pool(runs):
    lengths = runs["4"]["lengths"]
    assert all(4 * 256 <= n < 6 * 256 for n in lengths[:3]) and 8 * 256 < lengths[3] < 10 * 256, lengths
    assert sum(n // 256 + 1 for n in lengths) > 24  # their blocks cannot all stay


def test_without_the_knob_an_evicted_prompt_is_computed_again(runs):
    off = runs["0"]
    assert off["after"][0][2] == 0  # the first resend (the second finds the first's blocks)
    assert off["counters"]["saved"] == -1.0  # no table, no counters


def test_with_the_knob_its_whole_blocks_come_back_from_host_memory(runs):
    on = runs["4"]
    whole = (on["lengths"][0] - 1) // 256 * 256
    assert on["after"][0][2] >= whole, on["after"]
    counters = on["counters"]
    assert counters["restored"] >= whole // 256 and counters["saved"] >= counters["restored"], counters
    assert counters["dropped"] == 0 and 0 < counters["held"] <= 64, counters


def test_replies_are_those_before_the_eviction(runs):
    for arm in ("0", "4"):
        before, after = runs[arm]["before"], runs[arm]["after"]
        assert [r for r, _, _ in after] == [r for r, _, _ in before], arm
    assert runs["0"]["before"][0][0] == runs["4"]["before"][0][0]


def test_a_reply_running_meanwhile_is_the_one_it_gets_alone(runs):
    """Eviction, saves and restores while another request decodes leave its blocks alone."""
    for arm in ("0", "4", "4-tp2"):
        assert runs[arm]["overlapped"], arm  # it was still decoding when the long prompt came
        assert runs[arm]["beside"][0] == runs[arm]["alone"][0], arm


def test_a_tensor_parallel_pairs_ranks_bring_back_the_same_blocks(runs):
    """Rank 0 schedules and rank 1 follows its steps: both tables must make the same choices,
    or rank 1 would attend over other blocks than rank 0 and the replies would change."""
    one, two = runs["4"], runs["4-tp2"]
    assert two["after"][0][2] == one["after"][0][2] > 0
    assert [r for r, _, _ in two["after"]] == [r for r, _, _ in two["before"]]
    assert two["before"][0][0] == one["before"][0][0]  # greedy: TP=2 replies as TP=1 does
    assert two["counters"]["restored"] == one["counters"]["restored"]


def test_a_full_table_lets_the_least_recently_used_go(patched_engine):
    """The slot bookkeeping alone: a table of three slots keeps the three hashes most recently
    saved or used, and reuses the slot of the one that went."""
    tier = engine_module(patched_engine, "runtime.host_tier")

    class Allocator:
        bytes_per_block = 8

    table = tier.Table(Allocator(), 3, pinned=False)
    slots = [table.slot_for(h) for h in (101, 102, 103)]
    assert sorted(slots) == [0, 1, 2] and table.dropped == 0
    table.slot_of.move_to_end(101)  # used again
    reused = table.slot_for(104)
    assert reused == slots[1] and table.dropped == 1  # 102 was the least recently used
    assert list(table.slot_of) == [103, 101, 104]
    table.clear()
    assert not table.slot_of and len(table.free) == 3


def test_a_table_larger_than_the_host_can_spare_is_cut_to_half_its_available_memory(patched_engine, monkeypatch):
    """A size meant for a serving node (the production set's 32 GiB) on a smaller machine: the
    table takes at most half the available memory, shared by the ranks that meet on loopback."""
    tier = engine_module(patched_engine, "runtime.host_tier")
    for name in ("LOCAL_WORLD_SIZE", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    alone = tier.host_room_mib()
    available = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemAvailable:"))
    assert abs(alone - available // 2048) < available // 2048 // 4  # memory moves a little between the reads
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert tier.local_ranks() == 2
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.2")  # one rank a node
    assert tier.local_ranks() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert tier.local_ranks() == 4

"""0760 PB_TAIL_REUSE: a resent prompt finds every token it shares with an earlier prompt cached
but the last two, not only the whole 256-token blocks, and replies as a cold run does, also
when the earlier reply ran past the prompt's last block.

Real text (this Python's argparse source), each test opening with a line of its own so no other
test's cache serves it. The negative controls change one token after the last whole block, or
send another prompt: the cached count is then exactly the prefix the prompts share.
"""

import argparse

import httpx
import pytest

from patchbay.runtime.models import model_path

from .conftest import ALL_ON, LOCAL, Server, metric
from .test_prefix_reuse import ask, prompt_ids, shared

pytestmark = pytest.mark.engine

TEXT = open(argparse.__file__).read()[:12000]
PAGE = 256  # the local config's tokens a block


@pytest.fixture(scope="module")
def server(patched_engine, tmp_path_factory):
    """The embedded default (its model and 256-token blocks) with the local set, 0760 among it."""
    assert ALL_ON.get("PB_TAIL_REUSE") == "1"
    s = Server(patched_engine, model_path(LOCAL), ALL_ON, tmp_path_factory.mktemp("run-tail"))
    yield s
    s.stop()


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.8, "top_p": 0.95, "seed": 11}], ids=["greedy", "seeded"])
@pytest.mark.parametrize("size", [3000, 200], ids=["blocks", "short"])
def test_a_resent_prompt_computes_two_tokens_and_replies_as_cold(server, settings, size):
    content = f"Tail check ({'seeded' if settings else 'greedy'}, {size}).\n{TEXT[:size]}"
    length = len(prompt_ids(server, content))
    assert (length % PAGE != 0) and (size < 1000) == (length < PAGE)  # a partial block; "short": the first block's
    cold, _, cached_cold = ask(server, content, **settings)
    warm, length_again, cached_warm = ask(server, content, **settings)
    again, _, cached_again = ask(server, content, **settings)
    assert cached_cold == 0 and length_again == length
    assert cached_warm == cached_again == length - 2
    assert warm == cold and again == cold


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.8, "top_p": 0.95, "seed": 5}], ids=["greedy", "seeded"])
def test_a_reply_past_the_prompts_last_block_leaves_a_copy(server, settings):
    """The first reply runs past the prompt's last block (which then is a whole block, hashed
    with reply tokens): a copy of the block's prompt rows is held, so resends still compute two
    tokens and reply as the cold send did."""
    chars = 2000
    while True:  # a prompt whose last block has at most 16 tokens to spare, so a 48-token reply fills it
        content = f"Tail check (long reply, {'seeded' if settings else 'greedy'}).\n{TEXT[:chars]}"
        length = len(prompt_ids(server, content))
        if PAGE - 16 <= length % PAGE < PAGE:
            break
        chars += 7
    cold, _, cached_cold = ask(server, content, max_tokens=48, **settings)
    warm, _, cached_warm = ask(server, content, max_tokens=48, **settings)
    again, _, cached_again = ask(server, content, max_tokens=48, **settings)
    assert cached_cold == 0
    assert cached_warm == cached_again == length - 2
    assert warm == cold and again == cold


def test_a_changed_token_after_the_last_whole_block_reuses_exactly_the_shared_prefix(server):
    chars = 4000
    while True:  # a last block of 120 tokens or more, so the change falls inside it
        base = f"Tail control (changed).\n{TEXT[:chars]}"
        base_ids = prompt_ids(server, base)
        if len(base_ids) % PAGE >= 120:
            break
        chars += 100
    ask(server, base)
    at = len(base) - 60  # well past the last whole block
    changed = base[:at] + ("#" if base[at] != "#" else "%") + base[at + 1:]
    common = shared(base_ids, prompt_ids(server, changed))
    assert common // PAGE == (len(base_ids) - 1) // PAGE  # the change lies in the last, partial block
    reply, length, cached = ask(server, changed)
    assert cached == common < length - 2


def test_a_growing_conversation_reuses_the_whole_previous_prompt(server):
    first = [{"role": "user", "content": f"Tail check (conversation).\n{TEXT[:2500]}"}]
    reply, first_length, _ = ask(server, first[0]["content"])
    second = first + [{"role": "assistant", "content": reply[0] or ""},
                      {"role": "user", "content": "Now say what the parser does with a bad option."}]
    body = {"model": server.model, "messages": second, "max_tokens": 8, "temperature": 0}
    ids = httpx.post(f"{server.url}/tokenize", json={"model": server.model, "messages": second}, timeout=60).json()["tokens"]
    first_ids = httpx.post(f"{server.url}/tokenize", json={"model": server.model, "messages": first},
                           timeout=60).json()["tokens"]
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    common = shared(first_ids, ids)
    # every token the two prompts share, up to the end of the first prompt (its reply's rows were decoded,
    # never offered); whole blocks alone would stop at the last whole one
    assert cached == min(common, first_length), (cached, common, first_length)
    assert cached > first_length // PAGE * PAGE


def test_another_prompt_reuses_only_what_it_shares(server):
    """Prompts of one block that share their first 60-odd tokens: the second finds exactly those
    cached. One that shares only the chat template's opening finds none (the tail is kept)."""
    content = f"Tail control (other).\n{TEXT[:500]}"
    ask(server, content)
    opening = f"Tail control (opening only): {''.join(reversed(TEXT[:500]))}"
    assert shared(prompt_ids(server, content), prompt_ids(server, opening)) < 32
    assert ask(server, opening)[2] == 0
    other = f"Tail control (other).\n{TEXT[:250]}{''.join(reversed(TEXT[250:500]))}"
    common = shared(prompt_ids(server, content), prompt_ids(server, other))
    _, length, cached = ask(server, other)
    assert 32 <= common < length - 2 < 256 and cached == common


def test_held_blocks_go_back_when_the_pool_runs_short(patched_engine, tmp_path_factory):
    """A pool of 24 blocks: six short prompts leave six tails behind (six blocks held), then a
    prompt of about 20 blocks still gets its reply, and the tails are gone. Its whole blocks stay
    cached after it, and cached blocks count as the pool's to give: a tail is held again. While a
    live request holds most of the pool, none is."""
    s = Server(patched_engine, model_path(LOCAL), ALL_ON, tmp_path_factory.mktemp("run-tail-small"),
               engine_args="--cb-num-blocks 24 --cb-max-batch-tokens 1024")
    try:
        before = blocks_used(s)  # the readiness check's tail
        for i in range(6):
            ask(s, f"Tail pressure {i}: say something short.", max_tokens=2)
        assert blocks_used(s) == before + 6
        assert ask(s, "Tail pressure 4: say something short.", max_tokens=2)[2] > 0  # held: found again
        long_text = open(argparse.__file__).read()[:21500]
        long_content = f"Tail pressure (long).\n{long_text}"
        _, length, _ = ask(s, long_content, max_tokens=4)
        assert length > (24 - 6 - before) * PAGE
        assert ask(s, "Tail pressure 5: say something short.", max_tokens=2)[2] == 0  # given back for the long prompt
        assert blocks_used(s) > 24 * 3 / 4  # the long prompt's whole blocks, cached
        assert ask(s, "Tail pressure (cached pool): say something short.", max_tokens=2)[2] == 0
        assert ask(s, "Tail pressure (cached pool): say something short.", max_tokens=2)[2] > 0
        # The long prompt again, streaming a 600-token reply (seconds on this model): while it holds
        # its blocks, no tail is held. Leaving the block closes the stream, which ends the request.
        # On a loaded machine the reply can end (or the engine set it aside) before the asks do: a
        # round where it was not running on both sides of the second ask proves nothing and is run
        # again with another prompt (once in a full run, the asks found its blocks free).
        body = {"model": s.model, "max_tokens": 600, "temperature": 0, "ignore_eos": True, "stream": True,
                "messages": [{"role": "user", "content": long_content}]}
        for round_ in range(3):
            short = f"Tail pressure (held pool {round_}): say something short."
            with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=body, timeout=300) as live:
                lines = live.iter_lines()
                assert any(line.startswith("data: {") and '"content"' in line for line in lines)  # decoding now
                ask(s, short, max_tokens=2)
                running_before = only_the_live_request_runs(s)
                cached = ask(s, short, max_tokens=2)[2]
                if running_before and only_the_live_request_runs(s):
                    assert cached == 0
                    break
        else:
            pytest.fail("the 600-token reply was not running around the asks in three rounds")
    finally:
        s.stop()


def only_the_live_request_runs(server) -> bool:
    """The engine generates one request and has none waiting (none set aside for lack of blocks)."""
    return metric(server, "pb_requests_running") == 1 and metric(server, "pb_requests_waiting") == 0


def blocks_used(server) -> int:
    return int(metric(server, "pb_kv_blocks_used"))

"""Reuse of a cached prompt prefix across requests, as the production set serves it today.

An agent resends its whole conversation every turn and retries identical requests. A prompt
whose opening blocks are already in the KV cache resumes from them: `cached_tokens` says how
many tokens it did not recompute, and the reply is byte for byte the cold one (greedy and
seeded sampled). Negative controls: one token changed at the start, in the middle or near the
end, or another prompt of the same length, never reuse more than the prefix the two prompts
share. Prompts are real text (this Python's argparse source), each test opening with a line
of its own so no other test's cache serves it.
"""

import argparse

import httpx
import pytest

from patchbay.runtime.models import model_path

from .conftest import ALL_ON, LOCAL, Server

pytestmark = pytest.mark.engine

TEXT = open(argparse.__file__).read()[:12000]


@pytest.fixture(scope="module")
def server(patched_engine, tmp_path_factory):
    """The embedded default (its 64K-context model and 256-block pool) with the local knob set."""
    s = Server(patched_engine, model_path(LOCAL), ALL_ON, tmp_path_factory.mktemp("run-reuse"))
    yield s
    s.stop()


def ask(server, content: str, **settings) -> tuple:
    body = {"model": server.model, "max_tokens": 24, "temperature": 0, "ignore_eos": True,
            "messages": [{"role": "user", "content": content}], **settings}
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    reply = r.json()
    message = reply["choices"][0]["message"]
    cached = (reply["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return (message.get("content"), message.get("reasoning_content")), reply["usage"]["prompt_tokens"], cached


def prompt_ids(server, content: str) -> list[int]:
    r = httpx.post(f"{server.url}/tokenize", json={"model": server.model,
                                                   "messages": [{"role": "user", "content": content}]}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.8, "top_p": 0.95, "seed": 11}], ids=["greedy", "seeded"])
def test_a_resent_prompt_resumes_from_the_cache_and_replies_as_cold(server, settings):
    content = f"Reuse check ({'seeded' if settings else 'greedy'}).\n{TEXT}"
    cold, length, cached_cold = ask(server, content, **settings)
    warm, length_again, cached_warm = ask(server, content, **settings)
    assert cached_cold == 0 and length_again == length
    assert cached_warm == length - 2  # every whole 256-token block, and the last one's tokens but two (0760)
    assert warm == cold


@pytest.mark.parametrize("where", ["start", "middle", "near the end"])
def test_a_changed_token_reuses_no_more_than_the_shared_prefix(server, where):
    base = f"Reuse control ({where}).\n{TEXT}"
    ask(server, base)
    at = {"start": 30, "middle": len(base) // 2, "near the end": len(base) - 40}[where]
    changed = base[:at] + ("#" if base[at] != "#" else "%") + base[at + 1:]
    common = shared(prompt_ids(server, base), prompt_ids(server, changed))
    reply, length, cached = ask(server, changed)
    assert cached <= common < length
    assert cached >= common - 256 if where != "start" else cached == 0  # the complete blocks before the change


def test_another_prompt_of_the_same_length_reuses_nothing(server):
    ask(server, f"Reuse control (other).\n{TEXT}")
    other = "".join(reversed(TEXT))
    _, _, cached = ask(server, f"Reuse control (other).\n{other}")
    common = shared(prompt_ids(server, f"Reuse control (other).\n{TEXT}"),
                    prompt_ids(server, f"Reuse control (other).\n{other}"))
    assert common < 256 and cached == 0


def test_a_prompt_whose_reply_ends_at_its_first_token_leaves_every_block(server):
    """0730: the chunk that completes a prompt is registered even when its request ends with the
    token it produced (max_tokens 1), so the next send finds every complete block, not only the
    chunks before the last (the local config prefills 1,024 tokens a step; the prompt is cut so
    that its last chunk holds two blocks or more)."""
    chars = 9000
    while True:  # the local config's 1,024-token chunks: leave at least 512 tokens to the last
        content = f"Reuse check (one token).\n{TEXT[:chars]}"
        length = len(prompt_ids(server, content))
        if length % 1024 >= 512:
            break
        chars -= 150
    _, first_length, cached_first = ask(server, content, max_tokens=1)
    _, length_again, cached = ask(server, content)
    assert cached_first == 0 and first_length == length_again == length
    assert length - 256 < cached < length, (length, cached)  # the last chunk's blocks too (0760 adds its tail)

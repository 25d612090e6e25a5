"""0830 PB_KV_FP8 through a live server on the CPU: the local set plus the knob, where upstream's
update writes e4m3 rows and reads them back dequantized (the kernels run on a GPU only; their
bits are checked by tests/test_kv_fp8.py and tests/test_kernels_gpu.py).

A resent prompt resumes from the e4m3 cache and replies as its cold send did (greedy and seeded),
since every attention, the cold prompt's own included, reads the cache's rows; another prompt
reuses only the prefix it shares. Two gloo ranks, each caching its own KV heads, reply as one.
0840's int8 rows (PB_KV_INT8) go through the same paths: a server of them resumes as cold too."""

import argparse
import dataclasses

import httpx
import pytest

from patchbay.runtime.models import model_path

from patchbay.measure import exact
from patchbay.runtime import launch

from .conftest import ALL_ON, LOCAL, Server, metric
from .test_prefix_reuse import ask, prompt_ids, shared
from .test_tp import TP_KNOBS, greedy, tp_config

pytestmark = pytest.mark.engine

TEXT = open(argparse.__file__).read()[:6000]


@pytest.fixture(scope="module")
def server(patched_engine, tmp_path_factory):
    s = Server(patched_engine, model_path(LOCAL), {**ALL_ON, "PB_KV_FP8": "1"}, tmp_path_factory.mktemp("run-kv-fp8"))
    yield s
    s.stop()


def test_the_server_keeps_its_cache_in_e4m3(server):
    log = server.files.log.read_text()
    assert "PB_KV_FP8: the KV cache holds e4m3" in log and "PB_KV_FP8=1" in log
    assert metric(server, "pb_kv_blocks_total") == 256  # --cb-num-blocks 256: the same blocks, half the bytes
    r = httpx.get(f"{server.url}/health", timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("settings", [{}, {"temperature": 0.8, "top_p": 0.95, "seed": 17}], ids=["greedy", "seeded"])
def test_a_resent_prompt_resumes_from_the_e4m3_cache_and_replies_as_cold(server, settings):
    content = f"e4m3 cache check ({'seeded' if settings else 'greedy'}).\n{TEXT[:3000]}"
    length = len(prompt_ids(server, content))
    cold, _, cached_cold = ask(server, content, **settings)
    warm, length_again, cached_warm = ask(server, content, **settings)
    assert cached_cold == 0 and length_again == length
    assert cached_warm == length - 2  # 0760 recomputes the last two tokens
    assert warm == cold


def test_another_prompt_reuses_only_the_prefix_it_shares(server):
    first = f"e4m3 cache, shared opening.\n{TEXT[:2500]}"
    second = first[:1500] + " A different turn here." + TEXT[3000:4000]
    ask(server, first)
    common = shared(prompt_ids(server, first), prompt_ids(server, second))
    _, _, cached = ask(server, second)
    assert 0 < cached <= common


def test_tp2_ranks_each_cache_their_heads_in_e4m3_and_reply_as_tp1(patched_engine, server, tmp_path):
    # a head's scale follows from that head alone, so a rank holding half the KV heads writes the
    # rows one rank writes for them
    cfg = dataclasses.replace(tp_config(tmp_path / "run"), knobs={**TP_KNOBS, "PB_KV_FP8": "1"})
    files = launch.RunFiles(cfg.run_path)
    launch.start(cfg, patched_engine, server.model, files, progress=lambda *_: None)
    try:
        for rank in (0, 1):
            assert "PB_KV_FP8: the KV cache holds e4m3" in files.rank_log(rank).read_text()
        for messages in exact.EXACTNESS_PROMPTS[:4]:
            assert greedy(cfg.url, server.model, messages)[0] == greedy(server.url, server.model, messages)[0]
    finally:
        launch.stop(files)


def test_an_int8_cache_resumes_resent_prompts_as_cold(patched_engine, tmp_path):
    s = Server(patched_engine, model_path(LOCAL), {**ALL_ON, "PB_KV_INT8": "1"}, tmp_path / "run")
    try:
        log = s.files.log.read_text()
        assert "PB_KV_INT8: the KV cache holds int8" in log and "PB_KV_INT8=1" in log
        assert metric(s, "pb_kv_blocks_total") == 256
        for settings in ({}, {"temperature": 0.8, "top_p": 0.95, "seed": 17}):
            content = f"int8 cache check ({'seeded' if settings else 'greedy'}).\n{TEXT[:3000]}"
            length = len(prompt_ids(s, content))
            cold, _, cached_cold = ask(s, content, **settings)
            warm, _, cached_warm = ask(s, content, **settings)
            assert cached_cold == 0 and cached_warm == length - 2 and warm == cold
    finally:
        s.stop()

"""0850 PB_KV_SIZING: the KV pool sized for 0370's kernels, with no attention masks.

The job (tests/kv_sizing_job.py) runs under Triton's CPU interpreter, where 0370's kernels take
every paged step: the memory handler's pages at air12's shapes from the free memory one H100 had
(upstream's figure reproduced, then the knob's), the tiny model's batching loop with and without
masks (the same replies), and the guard for a step that reaches sdpa's own path without a mask.
Without the interpreter on a machine with no GPU the kernels do not run, and the knob stands down."""

import pytest

from .conftest import engine_jobs

pytestmark = pytest.mark.engine

KNOBS = {"PB_VARLEN_ATTENTION": "1", "PB_VARLEN_FAST": "1", "PB_SPLIT_DECODE": "1", "PB_CACHE_READ": "1",
         "PB_KV_SIZING": "1"}


@pytest.fixture(scope="module")
def jobs(patched_engine, tiny_model):
    runs = {"interpreter": {"TRITON_INTERPRET": "1"}, "cpu": {"TRITON_INTERPRET": "0", "KV_SIZING_JOB": "why-not"}}
    with engine_jobs("kv_sizing_job.py", patched_engine, tiny_model, runs=runs, timeout=900, **KNOBS) as started:
        yield started


@pytest.fixture(scope="module")
def report(jobs):
    got = jobs["interpreter"].report()
    assert got["enabled"] is True and got["why_not"] is None
    return got


def test_the_pool_gets_the_memory_masks_and_repeated_heads_were_charged(report):
    sizing = report["sizing"]
    # upstream's sizing, as the H100's production server logged it: 729 pages of 12 MiB from 25,297 MB
    assert sizing["off"]["pages"] == 729 and sizing["off"]["masks"] == 1
    # with the knob no masks are planned, and a cached token is charged its keys and values as stored
    assert sizing["on"]["masks"] == 0 and sizing["on"]["max_batch_tokens"] == sizing["off"]["max_batch_tokens"]
    assert sizing["on"]["pages"] > 2 * sizing["off"]["pages"]
    # both still fit what was available
    assert sizing["off"]["footprint"] <= sizing["available"] and sizing["on"]["footprint"] <= sizing["available"]
    assert sizing["on"]["pages"] * sizing["page_bytes"] <= sizing["available"]


def test_the_batching_loop_builds_no_mask_and_replies_the_same(report):
    loop = report["loop"]
    assert loop["prompt_lengths"] == [300, 120, 20]
    assert loop["off"]["mask_needed"] is True and loop["off"]["mask_builds"] > 0
    assert loop["on"]["mask_needed"] is False and loop["on"]["mask_builds"] == 0
    # 0370's kernels take every step either way (two layers a step), so the tokens are the same
    assert loop["on"]["kernel_calls"] == loop["off"]["kernel_calls"] > 0
    assert loop["on"]["replies"] == loop["off"]["replies"] and all(len(r) == 8 for r in loop["on"]["replies"])


def test_a_step_reaching_sdpa_without_a_mask_fails_loudly(report):
    assert report["guard"]["off"] is None
    assert "PB_KV_SIZING" in report["guard"]["on"] and "turn PB_KV_SIZING off" in report["guard"]["on"]


def test_without_a_gpu_or_the_interpreter_the_knob_stands_down(jobs):
    got = jobs["cpu"].report()
    assert got["enabled"] is True and "GPU" in got["why_not"]

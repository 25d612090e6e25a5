"""0350 PB_STEP_PREP: the asynchronous batching loop's per-step host work, on the CPU.

The pairs it changes exist only with a GPU (W10 measured the time on an H200); here both hooks
run through upstream's own functions with the knob on and off, and give upstream's values."""

import pytest

from .conftest import engine_jobs

pytestmark = pytest.mark.engine

KNOBS = {"off": {"PB_ASYNC_BATCHING": "1"}, "on": {"PB_ASYNC_BATCHING": "1", "PB_STEP_PREP": "1"},
         "without_async": {"PB_STEP_PREP": "1"}}


@pytest.fixture(scope="module")
def jobs(patched_engine):
    with engine_jobs("step_prep_job.py", patched_engine, runs=KNOBS, timeout=300) as started:
        yield started


@pytest.fixture(scope="module")
def off(jobs):
    return jobs["off"].report()


@pytest.fixture(scope="module")
def on(jobs):
    return jobs["on"].report()


def test_carry_over_ids_written_in_place_equal_upstreams_list(off, on):
    # 200 random steps, some carrying nothing, some every request: the host tensor the GPU reads
    # holds upstream's values whether it was written in place (on) or copied from the list (off)
    for report in (off, on):
        assert report["carry_over"]["cases"] == 200 and report["carry_over"]["mismatches"] == []
        assert report["carry_over"]["carried"] > 200
    assert off["carry_over"]["lists_built"] == 200 and on["carry_over"]["lists_built"] == 0


def test_host_side_of_a_pair_never_fills_its_mask_when_on(off, on):
    # 8 query tokens, no cache: upstream fills the host mask's 8 x 8 region before building it
    assert off["host_reset"] == {"host_marked": False, "device_marked": False, "mask_filled": 64,
                                 "bulk_zeroed": 63}
    # with the knob the host side is marked at its creation (0240 builds the region on the
    # device), so the memset is skipped; the rest of the reset is upstream's
    assert on["host_reset"] == {"host_marked": True, "device_marked": False, "mask_filled": 0, "bulk_zeroed": 63}


def test_host_side_is_left_unmarked_without_async_batching(jobs):
    report = jobs["without_async"].report()
    assert report["host_reset"]["host_marked"] is False and report["host_reset"]["mask_filled"] == 64


def test_decode_step_masks_built_with_fewer_operations_equal_upstreams(off, on):
    # 200 random steps through 0240's transfer, most of them decode steps (padding rows and keys
    # included), float32 and bfloat16: the region on the device equals upstream's host-built mask
    for report in (off, on):
        assert report["masks"]["cases"] == 200 and report["masks"]["mismatches"] == []
    assert on["masks"]["decode_steps"] >= 150
    assert off["masks"]["short_path"] == 0 and on["masks"]["short_path"] == on["masks"]["decode_steps"]

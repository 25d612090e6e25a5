"""0440 PB_HOST_THREADS: torch's intra-op CPU threads set when the server starts."""

import pytest

from .conftest import engine_job

pytestmark = pytest.mark.engine


def test_the_knob_sets_torchs_threads_and_unset_keeps_torchs_own(patched_engine):
    off = engine_job("host_threads_job.py", patched_engine, timeout=120, OMP_NUM_THREADS="2")
    on = engine_job("host_threads_job.py", patched_engine, timeout=120, OMP_NUM_THREADS="2", PB_HOST_THREADS="1")
    assert off == {"before": 2, "after": 2, "error": None}
    assert on == {"before": 2, "after": 1, "error": None}


def test_a_value_out_of_range_is_refused_naming_the_knob(patched_engine):
    bad = engine_job("host_threads_job.py", patched_engine, timeout=120, PB_HOST_THREADS="-1")
    assert bad["error"] and "PB_HOST_THREADS" in bad["error"], bad

"""Profiling a served engine under load (served_profile), here with CPU ranks."""

import json
import os

import pytest

from patchbay.device import served_profile

from ..conftest import ROOT


@pytest.mark.engine
def test_served_profile_profiles_every_rank_under_load(patched_engine, tiny_model, tmp_path, monkeypatch):
    """Issue 6's all-reduce share, on the CPU: two TP ranks serve under the served-profile profiler;
    at each level the streams run while both ranks are profiled (SIGUSR1 .. SIGUSR2), and each
    rank writes its window (on a CPU there are no CUDA graphs, so no step table)."""
    from ..conftest import free_port

    with monkeypatch.context() as env:  # the engine first on the servers' path
        env.setenv("PYTHONPATH", str(patched_engine.site))
        code = served_profile.served_profile_job(tmp_path / "p", [1, 2], 48, 0.3, {"PB_FINGERPRINT": "1"}, False, 32,
                                      tiny_model, 2, free_port(), device="cpu", distinct=True)
    assert code == 0
    record = json.loads((tmp_path / "p" / "served-profile.json").read_text())
    assert record["distinct_prompts"] is True
    assert len({served_profile.stream_prompt(n) for n in range(128)} | {served_profile.COUNT_PROMPT}) == 129
    rows = record["rows"]
    assert [(r["level"], r["rank"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert len({r["pid"] for r in rows}) == 2 and all(r["seconds"] >= 0.3 for r in rows)
    assert all(r["graph_replays"] == 0 and r["wall_ms_per_step"] is None for r in rows)
    for rank in (0, 1):
        assert sorted(p.name for p in (tmp_path / "p" / f"rank{rank}").iterdir()) == \
            ["started-0", "started-1", "window-0.json", "window-1.json"]
        window = json.loads((tmp_path / "p" / f"rank{rank}" / "window-0.json").read_text())
        assert window["warm_s"] > 0 and window["seconds"] >= 0.3  # traced unrecorded first, then the window
    table = (tmp_path / "p" / "table.md").read_text().splitlines()
    assert len(table) == 6 and table[2].startswith("| C1, rank 0 | no CUDA-graph replays")


@pytest.mark.engine
def test_served_profile_makes_the_engines_graph_captures_wait_for_the_profiler(patched_engine):
    """The profiler synchronizes the device when a window starts and ends, which a CUDA-graph capture
    does not survive (W09): the engine's capture and the profiler's transitions share one lock."""
    import subprocess
    import sys

    script = """
import json
from patchbay.device import served_profile
from transformers.generation.continuous_batching.model_runner import ModelRunner
seen = []
def probe(self, *args):  # stands in for the capture (no GPU here)
    seen.append(served_profile.CAPTURE.locked())
ModelRunner._capture_graph = probe
first, again = served_profile.guard_captures(), served_profile.guard_captures()
ModelRunner._capture_graph(None, None, None)
print(json.dumps({"guarded": [first, again], "held_during": seen, "free_after": not served_profile.CAPTURE.locked(),
                  "wrapped_once": ModelRunner._capture_graph.__wrapped__ is probe}))
"""
    env = {**os.environ, "PYTHONPATH": f"{patched_engine.site}:{ROOT / 'src'}"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"guarded": [True, True], "held_during": [True],
                                                                "free_after": True, "wrapped_once": True}


def test_served_table_has_the_collectives_column():
    profile = {"top_kernels": [{"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ms_per_step": 0.8},
                               {"name": "pb_moe_down", "ms_per_step": 0.5}],
               "category_ms_per_step": {"collective": 0.8, "experts": 0.5}, "gpu_busy_ms_per_step": 1.3,
               "wall_ms_per_step": 2.0}
    table = served_profile.render_served([{"level": 1, "rank": 1, **profile}]).splitlines()
    assert "collectives" in table[0]
    assert table[2] == "| C1, rank 1 | 2.00 | 1.30 | 0.50 | 0.00 | 0.00 | 0.00 | 0.00 | 0.80 | 0.00 | 0.70 |"

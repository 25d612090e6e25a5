"""The device's sampler job (gpu_sampler), run small on the CPU: the four paths timed, alone == batched (a CPU draws eagerly: graphed == eager)."""

import json
import os
import subprocess
import sys

from ..conftest import ROOT, engine_environ


def test_the_sampler_job_times_both_paths_and_checks_batched_rows(patched_engine, tmp_path):
    env = engine_environ(patched_engine)
    env["PYTHONPATH"] += f"{os.pathsep}{ROOT / 'src'}"
    cmd = [sys.executable, "-m", "patchbay.device", "sampler", str(tmp_path), "--device", "cpu", "--vocab", "2000",
           "--rows", "1,5", "--reps", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "sampler.json").read_text())
    assert [(lv["settings"], lv["rows"]) for lv in result["levels"]][2:] == [
        ("agent", 1), ("agent", 5), ("all", 1), ("all", 5), ("mixed", 1), ("mixed", 5)]
    assert all(lv["alone_equals_batched"] and lv["graphed_equals_eager"] and lv["per_row_ms"] > 0
               and lv["batched_ms"] > 0 and lv["graphed_ms"] > 0 and lv["free_ms"] > 0 for lv in result["levels"])
    assert all(lv["free_alone_equals_batched"] and lv["free_graphed_equals_eager"] for lv in result["levels"])
    assert all(lv["free_same_as_sorted"] == lv["rows"] for lv in result["levels"])  # no rounding tie in these
    assert "| agent | 5 |" in proc.stdout

"""Which operations keep a row's bits among other rows (gpu_invariance), on the CPU."""

import json
import os

import pytest

from ..conftest import ROOT, engine_environ


@pytest.mark.engine
def test_invariance_probe_finds_the_moe_path_switch_on_the_cpu(patched_engine, tmp_path):
    """patchbay.device.gpu_invariance at cut-down widths on this CPU (Triton through its interpreter): the
    per-row kernels (RMSNorm, rotary, 0370's attention) keep a row's bits among 200 rows, while the
    MoE changes path above its decode size (the fused kernels, then grouped_mm), so the row's bits
    change there."""
    import subprocess
    import sys

    env = engine_environ(patched_engine, TRITON_INTERPRET="1")  # the interpreter's own dot first on the path
    env["PYTHONPATH"] += f"{os.pathsep}{ROOT / 'src'}"
    cmd = [sys.executable, "-m", "patchbay.device", "invariance", "--out", str(tmp_path), "--device", "cpu", "--small"]
    proc = subprocess.run([*cmd, "--rows", "1,2,200"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "invariance.json").read_text())
    results = {(r["op"], r["rows"]): r for r in report["results"]}
    assert len(results) == 12 * 2 and {n for _, n in results} == {2, 200}
    for op in ("RMSNorm (0300)", "rotary (0290)", "attention (0370 varlen kernel)"):
        assert results[(op, 2)]["equal"] and results[(op, 200)]["equal"], op
    moe = "MoE: router 0280 + experts 0220 (grouped_mm above the decode size)"
    assert results[(moe, 2)]["equal"] and not results[(moe, 200)]["equal"]
    assert results[(moe, 200)]["max_abs_diff"] > 0
    bad = subprocess.run([*cmd, "--rows", "1,x"], env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "--rows '1,x'" in bad.stderr and "Traceback" not in bad.stderr

"""The device sweep job's plumbing on a CPU (the harness itself: tests/measure/test_sweep.py)."""

import pytest

from patchbay.device import sweep as device_sweep
from patchbay.measure.tools import sweep


def test_the_default_tiles_parse():
    assert sweep.parse_tiles(device_sweep.GEMM_TILES, 5)[0] == (128, 128, 64, 8, 3)
    assert all(len(t) == 4 for t in sweep.parse_tiles(device_sweep.GATE_UP_TILES, 4))


def test_overridden_restores_the_engines_settings():
    class Module:
        TMA, TILES = False, (1, 2)

    with pytest.raises(RuntimeError), device_sweep.overridden(Module, TMA=True, TILES=(3, 4)):
        assert Module.TMA and Module.TILES == (3, 4)
        raise RuntimeError("a config that fails")
    assert Module.TMA is False and Module.TILES == (1, 2)


def test_the_engine_cases_refuse_to_start_without_a_gpu(tmp_path, capsys):
    assert device_sweep.main(["gemm", str(tmp_path / "out"), "--tp", "1"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not (tmp_path / "out").exists()

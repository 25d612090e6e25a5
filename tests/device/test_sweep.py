"""The device sweep job's plumbing on a CPU (the harness itself: tests/measure/test_sweep.py)."""

import pytest

from patchbay.device import sweep as device_sweep
from patchbay.measure.tools import sweep


def test_the_default_tiles_parse():
    assert sweep.parse_tiles(device_sweep.GEMM_TILES, 5)[0] == (128, 128, 64, 8, 3)
    assert all(len(t) == 4 for t in sweep.parse_tiles(device_sweep.GATE_UP_TILES, 4))


def test_the_fp8_configs_cover_every_tile_and_program_count_then_the_other_depths():
    configs = device_sweep.fp8_configs("64w4s4,32w4s4", "264,132", "128,64")
    assert configs[0] == {"tile": [64, 4, 4], "programs": 264, "depth": 128}  # the engine's own first
    assert len(configs) == 2 * 2 + 2 and {c["depth"] for c in configs[-2:]} == {64}
    assert all(c["tile"] == [64, 4, 4] for c in configs if c["depth"] == 64)
    with pytest.raises(ValueError):
        device_sweep.fp8_configs("64x4", "264", "128")


def test_overridden_restores_the_engines_settings():
    class Module:
        TMA, TILES = False, (1, 2)

    with pytest.raises(RuntimeError), device_sweep.overridden(Module, TMA=True, TILES=(3, 4)):
        assert Module.TMA and Module.TILES == (3, 4)
        raise RuntimeError("a config that fails")
    assert Module.TMA is False and Module.TILES == (1, 2)


def test_the_engine_cases_refuse_to_start_without_a_gpu(tmp_path, capsys):
    assert device_sweep.main(["gemm", str(tmp_path / "out"), "--tp", "1"]) == 2
    assert device_sweep.main(["fp8", str(tmp_path / "out"), "--rows", "8"]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not (tmp_path / "out").exists()

import json

import pytest
import torch

from patchbay.measure.tools import sweep


def blocked_matmul(a, b, cfg, _copy):
    """a @ b with K walked in blocks of cfg["block"], in cfg["dtype"]: every float32 order of the
    same blocks gives one result here, float16 another, and a block that does not divide K fails."""
    k = a.shape[1]
    if k % cfg["block"]:
        raise ValueError(f"block {cfg['block']} does not divide K={k}")
    dt = cfg["dtype"]
    acc = torch.zeros(a.shape[0], b.shape[1], dtype=dt)
    for k0 in range(0, k, cfg["block"]):
        acc += a[:, k0:k0 + cfg["block"]].to(dt) @ b[k0:k0 + cfg["block"]].to(dt)
    return acc.float()


def test_the_sweep_records_bits_errors_and_a_best_config_that_keeps_the_bits():
    torch.manual_seed(0)
    a, b = torch.randn(8, 64), torch.randn(64, 16)
    ref = blocked_matmul(a, b, {"block": 16, "dtype": torch.float32}, 0)
    configs = sweep.grid(block=[16, 24], dtype=[torch.float32, torch.float16])
    assert [(c["block"], c["dtype"]) for c in configs] == [(16, torch.float32), (16, torch.float16),
                                                           (24, torch.float32), (24, torch.float16)]
    printed = []
    rows = sweep.sweep(lambda cfg, i: blocked_matmul(a, b, cfg, i), configs, ref, "graph", say=printed.append,
                       reps=2)
    assert rows[0]["same_bits"] and rows[0]["max_abs"] == 0.0 and rows[0]["ms"] >= 0
    assert rows[1]["same_bits"] is False and 0 < rows[1]["max_abs"] < 0.1  # float16: near, other bits
    assert all("does not divide K=64" in r["error"] and "ms" not in r for r in rows[2:])
    assert [json.loads(p)["cfg"]["block"] for p in printed] == [16, 16, 24, 24]
    assert sweep.best(rows) is rows[0]  # whatever the clock said of float16
    assert sweep.best(rows, same_bits=False) in rows[:2]
    assert sweep.best(rows[2:]) is None


def test_results_are_rewritten_after_each_case(tmp_path):
    results = sweep.Results(tmp_path, "toy", {"command": "python -m …"})
    rows = [{"cfg": [1], "ms": 2.0, "same_bits": True}, {"cfg": [2], "ms": 1.0, "same_bits": True},
            {"cfg": [3], "ms": 0.5, "same_bits": False}]
    results.add({"m": 1}, rows, cublas_ms=1.5)
    results.add({"m": 2}, rows[2:])
    data = json.loads((tmp_path / "sweep-toy.json").read_text())
    assert [(c["case"], c["best"]) for c in data["cases"]] == [({"m": 1}, [2]), ({"m": 2}, None)]
    assert data["cases"][0]["cublas_ms"] == 1.5 and data["command"] == "python -m …"


def test_copies_rotate_an_operand_past_l2():
    assert sweep.copies_for(4096 * 14336 * 2) == 1  # a weight of 117 MB is past L2 on its own
    assert sweep.copies_for(128 * 4096 * 2) == 64  # a router's 1 MB: the most copies
    assert sweep.copies_for(8 << 20) == 12


def test_tile_specs():
    assert sweep.parse_tiles("128x64w8s3,64x64w4s4", 4) == [(128, 64, 8, 3), (64, 64, 4, 4)]
    with pytest.raises(ValueError, match="NxNxNwWARPSsSTAGES"):
        sweep.parse_tiles("128x64w8s3", 5)
    with pytest.raises(ValueError, match="timer 'fast'"):
        sweep.timer("fast")

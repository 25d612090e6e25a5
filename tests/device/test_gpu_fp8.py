"""0810's device job (gpu_fp8) run on the CPU under Triton's interpreter at small shapes, in
float32: each product's FP8 result near its twin's, and the table it writes."""

import json

from ..conftest import engine_code

JOB = """
import json, sys
from patchbay.device import gpu_fp8
from patchbay.runtime import synth
import torch
gpu_fp8.DEVICE, gpu_fp8.DTYPE = "cpu", torch.float32
gpu_fp8.DENSE = {"k_proj": (192, 256), "o_proj": (256, 320)}  # a ragged grid and a whole one
gpu_fp8._time = lambda fn, iters, graphs: (fn(), 1e-3)[1]  # no CUDA graphs here: the bits, not the time
air12 = synth.air12_config
def small():
    config = air12()
    config.hidden_size, config.moe_intermediate_size, config.n_routed_experts, config.num_experts_per_tok = 256, 128, 8, 2
    return config
synth.air12_config = small
sys.exit(gpu_fp8.main(["--out", sys.argv[1], "--tokens", "1,5", "--iters", "1"]))
"""


def test_fp8_job_gives_near_the_twins_sums_and_its_table(patched_engine, tmp_path):
    proc = engine_code(JOB.replace("sys.argv[1]", repr(str(tmp_path))), patched_engine, timeout=600,
                       TRITON_INTERPRET="1")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "fp8.json").read_text())
    assert [(r["product"], r["tokens"]) for r in result["rows"]] == [
        ("k_proj", 1), ("k_proj", 5), ("o_proj", 1), ("o_proj", 5), ("routed experts", 1), ("routed experts", 5)]
    assert all(r["error"] < 1e-5 for r in result["rows"]), result  # float32: the sums' order only
    lines = (tmp_path / "table.md").read_text().splitlines()
    assert lines[0].startswith("| product | tokens | fp8 kernel |") and len(lines) == 2 + 6
    assert lines[-1].startswith("| routed experts | 5 |") and "| – | 1.00 |" in lines[-1], lines

"""The table of one MoE layer's experts implementations (gpu_moe)."""

import json


def test_moe_sweep_table_lists_every_arm_per_token_count(tmp_path):
    from patchbay.device import gpu_moe

    result = {"rows": [
        {"tokens": 1, "roofline_us": 66.5, "impl": {
            "grouped_mm": {"us": 173.8, "of_roofline": 0.383}, "pb_triton:shipped": {"us": 84.6, "of_roofline": 0.787},
            "align:triton": {"us": 5.3, "equal": True}}},
        {"tokens": 64, "roofline_us": 1048.1, "impl": {
            "grouped_mm": {"us": 1541.9, "of_roofline": 0.680}, "pb_triton:shipped": {"error": "RuntimeError: x"}}}]}
    lines = gpu_moe.render(result).splitlines()
    assert lines[0] == "| implementation | 1 tok | 64 tok |"
    assert "| roofline | 66 | 1048 |" in lines
    assert "| grouped_mm | 174 (0.38) | 1542 (0.68) |" in lines
    assert "| pb_triton:shipped | 85 (0.79) | error |" in lines
    assert "| align:triton | 5.3 | - |" in lines
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(result))
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "patchbay.device", "moe", "table", str(path)], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == gpu_moe.render(result)

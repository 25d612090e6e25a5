"""The tables of a window made from gpu_profile runs."""

from patchbay.device import profile_window


def test_a_profiled_cold_prompt_gets_a_row_in_the_step_table():
    kernels = [{"name": "flash_fwd_kernel", "ms_per_step": 90.0}, {"name": "sm90_xmma_gemm_bf16", "ms_per_step": 60.0},
               {"name": "GroupProblemShape<cutlass>", "ms_per_step": 40.0}]
    profile = {"top_kernels": kernels, "category_ms_per_step": {"attention": 90.0, "gemm": 60.0, "experts": 45.0},
               "gpu_busy_ms_per_step": 195.0, "wall_ms_per_step": 250.0}
    record = {"passes": [{"setting": "s", "prefill_tokens": 8192, "ttft_s": 0.25, "ttft_all_s": [0.25, 0.26],
                          "profile": profile}]}
    lines, summary = profile_window.window_tables([("p", record)])
    row = next(line for line in lines if line.startswith("| p / s, cold 8192-token prompt |"))
    # wall, busy, experts, GEMMs, attention, gathers, sampling, collectives, other (the 5 ms the top list
    # leaves out), host gap
    assert row == ("| p / s, cold 8192-token prompt | 250.00 | 195.00 | 40.00 | 60.00 | 90.00 | 0.00 | 0.00 | 0.00 "
                   "| 5.00 | 55.00 |")
    assert "| p / s | 8192 | 0.250 / 0.260 |" in lines and summary["ttft_s"] == {"p / s": 0.25}

"""What of the GPU runner can be checked without a GPU: the roofline model and the assembly of a
window from per-setting `ab` windows (the GPU runs themselves land as results windows)."""

import json
import os

import pytest

from patchbay.device import gpu, roofline, served_profile, servers
from patchbay.runtime import synth

from ..conftest import ROOT
from ..measure.test_bench import make_window


def test_air12_roofline_matches_the_design_figure_at_c1():
    config = synth.air12_config()
    assert roofline.step_params(config, 1) == pytest.approx(3.78e9, rel=0.002)  # the active parameters
    assert roofline.tokens_per_s(config, 1) == pytest.approx(550, abs=1)
    rates = [roofline.tokens_per_s(config, c) for c in (1, 4, 8, 32, 128)]
    assert rates == sorted(rates)  # more streams share each weight read
    # At very high concurrency every expert is read each step: the bound flattens towards all weights.
    every_expert = roofline.step_params(config, 10_000)
    assert every_expert == pytest.approx(synth.count_params(config) - config.vocab_size * config.hidden_size, rel=0.01)


def test_assemble_sets_parts_next_to_the_roofline(tmp_path):
    parts_dir = tmp_path / "parts"
    a = make_window(parts_dir, "first")
    b = make_window(parts_dir, "second", rate_b=1.0)
    exact = tmp_path / "exact.json"
    exact.write_text(json.dumps({"differences": [], "transcripts": {}}))
    window = gpu.assemble(tmp_path / "results", "combined", [("one", a, "note one"), ("two", b, "note two")],
                          exact, "a test")
    assert window.name == "W01-combined"
    summary = json.loads((window / "summary.json").read_text())
    assert set(summary["parts"]) == {"one", "two"} and summary["exact_differences"] == 0
    level = next(iter(summary["parts"]["one"]["levels"].values()))
    assert level["of_roofline"] == pytest.approx(level["tps"] / level["roofline_tok_s"])
    text = (window / "SUMMARY.md").read_text()
    assert "| one | C" in text and "note two" in text and "0 differing responses" in text
    assert (window / "one" / "raw.jsonl").is_file() and (window / "two" / "SUMMARY.md").is_file()


def test_parse_env_takes_only_pb_names():
    assert gpu.parse_env('{"PB_GRAPH_BUCKETS": 1, "PB_X": true, "PB_Y": "a"}', "--b-env") == \
        {"PB_GRAPH_BUCKETS": "1", "PB_X": "1", "PB_Y": "a"}
    for bad in ('{"HOME": "/"}', '[1]', "{not json"):
        with pytest.raises(SystemExit, match="--a-env"):
            gpu.parse_env(bad, "--a-env")


def test_parse_env_takes_a_named_knob_set_and_changes_to_it():
    from patchbay.runtime.config import knob_set

    assert gpu.parse_env("@prod", "--a-env") == knob_set("prod")
    assert gpu.parse_env('@prod+{"PB_MOE_TMA": true, "PB_HOST_THREADS": 0}', "--b-env") == \
        {**knob_set("prod"), "PB_MOE_TMA": "1", "PB_HOST_THREADS": "0"}
    with pytest.raises(SystemExit, match=r"--a-env: KNOBS=fast is not a knob set \(allowed: minimal, prod, local"):
        gpu.parse_env("@fast", "--a-env")
    with pytest.raises(SystemExit, match="--b-env: not JSON"):
        gpu.parse_env("@prod+{oops", "--b-env")


@pytest.mark.engine
def test_profile_job_runs_settings_side_by_side_on_the_cpu(patched_engine, tiny_model, tmp_path):
    """gpu_profile's passes on the tiny model (no GPU, so no kernel table): a knob setting is
    applied and checked, replies are hashed, a cold prompt is timed."""
    import os
    import subprocess
    import sys

    from patchbay import ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}
    env["PYTHONPATH"] = f"{patched_engine.site}:{ROOT / 'src'}"
    cmd = [sys.executable, "-m", "patchbay.device", "profile", "--out", str(tmp_path), "--model", tiny_model,
           "--levels", "1,2", "--tokens", "6", "--prefill", "40", "--setting", "eager",
           "--setting", 'knob={"knobs": {"PB_GRAPH_BUCKETS": 1}, "levels": [2]}']
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "profile.json").read_text())
    assert record["settings"]["knob"]["knobs"] == {"PB_GRAPH_BUCKETS": 1}
    rows = [p for p in record["passes"] if "aggregate_tok_s" in p]
    assert [(p["setting"], p["concurrency"]) for p in rows] == [("eager", 1), ("eager", 2), ("knob", 2)]
    assert all(p["generated"] == 6 * p["concurrency"] and p["aggregate_tok_s"] > 0 for p in rows)
    # without CUDA graphs the knob changes nothing: the same replies
    assert rows[1]["replies_sha"] == rows[2]["replies_sha"]
    prefill = [p for p in record["passes"] if "prefill_tokens" in p]
    assert len(prefill) == 2 and all(p["ttft_s"] > 0 for p in prefill)

    assert record["build"] == patched_engine.build_id
    assert (tmp_path / "command.txt").read_text().startswith("python -m patchbay.device profile --out ")

    # the folder becomes a results window: tables of every pass, the notes, a headline
    notes = tmp_path / "notes.md"
    notes.write_text("## Findings\n\n- the tiny model on a CPU\n")
    results = tmp_path / "results"
    window_cmd = [sys.executable, "-m", "patchbay.device", "profile", "window", "--slug", "cpu-smoke", "--title",
                  "smoke", "--headline", "tiny on cpu", "--part", f"cpu={tmp_path}", "--notes", str(notes),
                  "--results-dir", str(results)]
    proc = subprocess.run(window_cmd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    window = results / "W01-cpu-smoke"
    text = (window / "SUMMARY.md").read_text()
    assert "| cpu / eager | C1 |" in text and "| cpu / knob | C2 |" in text and "| cpu / eager | 40 |" in text
    assert text.rstrip().endswith("- the tiny model on a CPU")
    summary = json.loads((window / "summary.json").read_text())
    assert summary["headline"] == "tiny on cpu" and set(summary["tok_s"]["cpu / eager"]) == {"1", "2"}
    assert (window / "cpu" / "profile.json").is_file() and "cpu: python -m patchbay.device profile" in \
        (window / "command.txt").read_text()
    proc = subprocess.run(window_cmd[:-6] + ["--part", f"x={tmp_path / 'missing'}"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "expected NAME=DIR with DIR/profile.json" in proc.stderr

    bad = cmd[:-2] + ["--setting", 'x={"knobs": {"PB_NOT_A_KNOB": 1}}']
    proc = subprocess.run(bad, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "PB_NOT_A_KNOB is not a knob of this build" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.engine
def test_start_ranks_serves_a_checkpoint_tensor_parallel(patched_engine, tiny_model, tmp_path, monkeypatch):
    """The GPU runner's own launch of TP ranks (for the two-GPU machine, where patchbay cannot
    build), here as two gloo ranks on the CPU: rank 0 answers, both stop."""
    import httpx

    from ..conftest import free_port

    port = free_port()
    with monkeypatch.context() as env:  # the engine first on the servers' path
        env.setenv("PYTHONPATH", str(patched_engine.site))
        procs = servers.start_ranks(tiny_model, 2, port, {"PB_FINGERPRINT": "1"}, tmp_path, device="cpu",
                                engine_args="--cb-num-blocks 32 --cb-max-batch-tokens 256",
                                rdzv_port=free_port(), ready_timeout=300)
    try:
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                       json={"model": tiny_model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200 and r.json()["pb_fingerprint"]
        assert "rank 1 follows rank 0's batches" in (tmp_path / "rank1.log").read_text()
    finally:
        for proc in procs:
            servers.stop_server(proc)
    assert all(proc.poll() is not None for proc in procs)


@pytest.mark.engine
def test_side_by_side_ab_of_tp1_against_tp2(patched_engine, tiny_model, tmp_path, monkeypatch):
    """Issue 6's A/B shape, on the CPU: one checkpoint served as 1 rank (A) and as 2 ranks (B),
    side by side, passes alternating; TP=2 gives TP=1's greedy replies, and the reference texts
    forced through both (--score) give TP=1's logprobs at float rounding."""
    from ..conftest import free_port

    port = free_port()
    with monkeypatch.context() as env:  # the engine first on the servers' path
        env.setenv("PYTHONPATH", str(patched_engine.site))
        knobs = {"PB_FINGERPRINT": "1", "PB_FORCED_DECODING": "1", "PB_TOKENIZE": "1"}
        code = gpu.side_by_side(False, port, [knobs, knobs], 32, tmp_path / "logs",
                                ["--suites", "count", "--max-tokens", "6", "--reps", "1", "--warmup", "0",
                                 "--concurrency", "1,2", "--window", "tp", "--results-dir", str(tmp_path / "r"),
                                 "--quiet"], model_dir=tiny_model, tps=(1, 2), device="cpu",
                                score=tmp_path / "score")
    assert code == 0
    window = next((tmp_path / "r").iterdir())
    cfg = json.loads((window / "config.json").read_text())
    assert cfg["url"].endswith(f":{port}") and cfg["b_server"]["url"].endswith(f":{port + 1}")
    summary = json.loads((window / "summary.json").read_text())
    assert summary["errors"] == 0 and all(c["equal"] for c in summary["replies_all_levels"].values())
    assert "rank 1 follows rank 0's batches" in (tmp_path / "logs" / "server-B" / "rank1.log").read_text()
    assert not (tmp_path / "logs" / "server-A" / "rank1.log").exists()
    tp = json.loads((tmp_path / "score" / "b-vs-a.json").read_text())
    together = json.loads((tmp_path / "score" / "a-together-vs-a-alone.json").read_text())
    assert tp["tokens"] == together["tokens"] > 1000 and len(tp["texts"]) == 4
    assert tp["max_abs"] < 1e-3 and together["max_abs"] < 1e-3
    greedy = json.loads((tmp_path / "score" / "greedy-b-vs-a.json").read_text())
    assert len(greedy) == 8 and all(row["equal"] for row in greedy)  # float32 on the CPU: the same replies


def test_checkpoint_ab_serves_one_tp2_server_with_the_production_knobs(patched_engine, tiny_model, tmp_path, monkeypatch):
    """A model only TP=2 holds gets one server of two ranks with config/prod.env.example's knobs;
    `--b-url` to itself reads that server's speed A against A."""
    from ..conftest import free_port

    port = free_port()
    with monkeypatch.context() as env:  # the engine first on the servers' path
        env.setenv("PYTHONPATH", str(patched_engine.site))
        code = gpu.checkpoint_ab(tiny_model, 2, port, False, 32, tmp_path / "logs",
                                 ["--b-url", f"http://127.0.0.1:{port}", "--suites", "count", "--max-tokens", "6",
                                  "--reps", "1", "--warmup", "0", "--concurrency", "1", "--window", "aa",
                                  "--results-dir", str(tmp_path / "r"), "--quiet"], device="cpu")
    assert code == 0
    window = next((tmp_path / "r").iterdir())
    assert json.loads((window / "summary.json").read_text())["errors"] == 0
    rank0 = (tmp_path / "logs" / "server" / "rank0.log").read_text()
    assert "PB_FUSED_MOE=1" in rank0 and "PB_TENSOR_PARALLEL=1" in rank0  # the production set, TP on
    assert "rank 1 follows rank 0's batches" in (tmp_path / "logs" / "server" / "rank1.log").read_text()


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


def test_a_profiled_cold_prompt_gets_a_row_in_the_step_table():
    from patchbay.device import gpu_profile

    kernels = [{"name": "flash_fwd_kernel", "ms_per_step": 90.0}, {"name": "sm90_xmma_gemm_bf16", "ms_per_step": 60.0},
               {"name": "GroupProblemShape<cutlass>", "ms_per_step": 40.0}]
    profile = {"top_kernels": kernels, "category_ms_per_step": {"attention": 90.0, "gemm": 60.0, "experts": 45.0},
               "gpu_busy_ms_per_step": 195.0, "wall_ms_per_step": 250.0}
    record = {"passes": [{"setting": "s", "prefill_tokens": 8192, "ttft_s": 0.25, "ttft_all_s": [0.25, 0.26],
                          "profile": profile}]}
    lines, summary = gpu_profile.window_tables([("p", record)])
    row = next(line for line in lines if line.startswith("| p / s, cold 8192-token prompt |"))
    # wall, busy, experts, GEMMs, attention, gathers, sampling, collectives, other (the 5 ms the top list
    # leaves out), host gap
    assert row == ("| p / s, cold 8192-token prompt | 250.00 | 195.00 | 40.00 | 60.00 | 90.00 | 0.00 | 0.00 | 0.00 "
                   "| 5.00 | 55.00 |")
    assert "| p / s | 8192 | 0.250 / 0.260 |" in lines and summary["ttft_s"] == {"p / s": 0.25}


@pytest.mark.engine
def test_served_profile_profiles_every_rank_under_load(patched_engine, tiny_model, tmp_path, monkeypatch):
    """Issue 6's all-reduce share, on the CPU: two TP ranks serve under the served-profile profiler;
    at each level the streams run while both ranks are profiled (SIGUSR1 .. SIGUSR2), and each
    rank writes its window (on a CPU there are no CUDA graphs, so no step table)."""
    from ..conftest import free_port

    with monkeypatch.context() as env:  # the engine first on the servers' path
        env.setenv("PYTHONPATH", str(patched_engine.site))
        code = served_profile.served_profile_job(tmp_path / "p", [1, 2], 48, 0.3, {"PB_FINGERPRINT": "1"}, False, 32,
                                      tiny_model, 2, free_port(), device="cpu")
    assert code == 0
    record = json.loads((tmp_path / "p" / "served-profile.json").read_text())
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


@pytest.mark.engine
def test_invariance_probe_finds_the_moe_path_switch_on_the_cpu(patched_engine, tmp_path):
    """patchbay.device.gpu_invariance at cut-down widths on this CPU (Triton through its interpreter): the
    per-row kernels (RMSNorm, rotary, 0370's attention) keep a row's bits among 200 rows, while the
    MoE changes path above its decode size (the fused kernels, then grouped_mm), so the row's bits
    change there."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": f"{patched_engine.site}:{ROOT / 'src'}", "TRITON_INTERPRET": "1"}
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

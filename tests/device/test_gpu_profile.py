"""gpu_profile on the tiny model (no GPU, so no kernel table), and its runs made into a window."""

import json

import pytest


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
           "--levels", "1,2", "--tokens", "6", "--prefill", "40", "--distinct-prompts", "--setting", "eager",
           "--setting", 'knob={"knobs": {"PB_GRAPH_BUCKETS": 1}, "levels": [2], "num_blocks": 16}',
           "--setting", 'moe={"knobs": {"PB_FUSED_MOE": 1}, "levels": [1], "num_blocks": 16}']
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "profile.json").read_text())
    assert record["settings"]["knob"]["knobs"] == {"PB_GRAPH_BUCKETS": 1}
    rows = [p for p in record["passes"] if "aggregate_tok_s" in p]
    assert [(p["setting"], p["concurrency"]) for p in rows] == [("eager", 1), ("eager", 2), ("knob", 2), ("moe", 1)]
    # the experts a setting runs are the ones its knobs choose at load, as a server's load does
    assert record["settings"]["moe"]["experts"] == "pb_triton"
    assert record["settings"]["eager"]["experts"] == record["settings"]["knob"]["experts"] != "pb_triton"
    assert all(p["generated"] == 6 * p["concurrency"] and p["aggregate_tok_s"] > 0 for p in rows)
    # without CUDA graphs the knob changes nothing: the same replies
    assert rows[1]["replies_sha"] == rows[2]["replies_sha"]
    # --distinct-prompts: each request of a pass its own prompt, so its own reply
    assert record["distinct_prompts"] is True and rows[1]["distinct_replies"] == 2
    prefill = [p for p in record["passes"] if "prefill_tokens" in p]
    assert len(prefill) == 3 and all(p["ttft_s"] > 0 for p in prefill)

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

    bad = cmd[:-4] + ["--setting", 'x={"knobs": {"PB_NOT_A_KNOB": 1}}']  # without eager's passes first
    proc = subprocess.run(bad, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "PB_NOT_A_KNOB is not a knob of this build" in proc.stderr
    assert "Traceback" not in proc.stderr

"""What of the GPU jobs can be checked without a GPU: a window assembled from per-setting `ab`
windows, the arms' environments, and the A/B jobs on the tiny model as CPU ranks (the GPU runs
themselves land as results windows)."""

import json

import pytest

from patchbay.device import gpu

from ..measure.test_bench import make_window


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
    # these servers run without 0030's context limit, so the long fifth text is scored as well
    assert tp["tokens"] == together["tokens"] > 1000 and len(tp["texts"]) == 5
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

"""What of the GPU runner can be checked without a GPU: the roofline model and the assembly of a
window from per-setting `ab` windows (the GPU runs themselves land as results windows)."""

import json

import pytest

from patchbay import gpu, roofline, synth

from .test_bench import make_window


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

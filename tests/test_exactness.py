"""The exactness contract, item 1: every knob unset == pristine upstream.

Checked twice: inside the engine (greedy ids and a logits hash per exactness prompt, through
`generate` and continuous batching) and through the HTTP API (the same fixed requests, the
same status codes and bodies). The last test shows the HTTP check is not blind: with the
knobs on, it reports the differences.
"""

import json

import pytest

from patchbay.measure import exact
from patchbay.runtime.launch import engine_env

pytestmark = pytest.mark.engine


def test_probe_knobs_off_matches_pristine(patched_engine, pristine_engine, tiny_model):
    patched = exact.probe_engine(engine_env(patched_engine, {}), tiny_model)
    pristine = exact.probe_engine(engine_env(pristine_engine, {}), tiny_model)
    # Each probe really ran its own engine.
    assert patched["engine"].startswith(str(patched_engine.site))
    assert pristine["engine"].startswith(str(pristine_engine.site))
    assert len(pristine["generate"]) == len(exact.EXACTNESS_PROMPTS) >= 8
    for i, (a, b) in enumerate(zip(patched["generate"], pristine["generate"])):
        assert a["ids"] == b["ids"], f"prompt {i}: greedy ids differ"
        assert a["logits_sha256"] == b["logits_sha256"], f"prompt {i}: logits differ"
    assert patched["batch"] == pristine["batch"]
    # The probe saw real, prompt-dependent output (a constant model would prove nothing).
    assert len({tuple(g["ids"]) for g in pristine["generate"]}) == len(pristine["generate"])


def test_http_knobs_off_matches_pristine(server_off, server_pristine):
    off = exact.http_transcript(server_off.url, server_off.model)
    pristine = exact.http_transcript(server_pristine.url, server_pristine.model)
    assert exact.differences(off, pristine) == []
    statuses = [r["status"] for r in pristine]
    assert statuses.count(200) >= 10, statuses  # most requests were real completions
    chat = next(r for r in pristine if r["request"].startswith("POST /v1/chat/completions"))
    assert chat["body"]["choices"][0]["message"]["content"], "the model answered with text"


def test_http_check_reports_knobs_that_are_on(server_on, server_pristine):
    on = exact.http_transcript(server_on.url, server_on.model)
    pristine = exact.http_transcript(server_pristine.url, server_pristine.model)
    diffs = exact.differences(on, pristine)
    changed = " ".join(d.split(":")[0] for d in diffs)
    assert "GET /v1/models" in changed  # PB_MODELS_INFO: 200 with the served model, not 500
    assert "POST /tokenize" in changed  # PB_TOKENIZE: a route upstream does not have
    # PB_SERVED_NAMES and PB_OPENAI_SHAPES: the first difference of a reply is now its model or id
    assert any(".body.id:" in d or ".body.model:" in d for d in diffs)
    assert any("pb_fingerprint" in json.dumps(t["body"]) for t in on)  # PB_FINGERPRINT
    assert not any("pb_fingerprint" in json.dumps(t["body"]) for t in pristine)
    assert any(".body.sse" in d for d in diffs)  # PB_SSE_DONE and PB_FINGERPRINT change streams


def test_a_patch_leaking_with_its_knob_off_is_caught(tmp_path, server_pristine, tiny_model):
    """The knob-off check can fail: a copy of the series whose SSE module (0020's overlay code)
    ignores its knob."""
    import shutil

    from patchbay import ROOT
    from patchbay.series import build, series

    from .conftest import Server

    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    shutil.copytree(ROOT / "engine", tmp_path / "engine", ignore=shutil.ignore_patterns("__pycache__"))
    sse = tmp_path / "engine" / "_pb" / "api" / "sse.py"
    gate = '    if not knobs.get("PB_SSE_DONE"):\n'
    assert sse.read_text().count(gate) == 1
    sse.write_text(sse.read_text().replace(gate, '    if not knobs.get("PB_SSE_DONE") and False:\n'))
    leaky_series, problems = series.load(tmp_path / "patches")
    assert not problems
    leaky = Server(build.build(leaky_series, progress=lambda *_: None), tiny_model, {}, tmp_path / "run")
    try:
        diffs = exact.differences(exact.http_transcript(leaky.url, leaky.model),
                                  exact.http_transcript(server_pristine.url, server_pristine.model))
    finally:
        leaky.stop()
    assert diffs and all("[DONE]" in d for d in diffs)

"""`patchbay exact`, the runnable exactness suite: it passes on the real series and fails, naming
the prompt and the first differing token, on a deliberately non-exact change."""

import subprocess
import sys

import pytest

from patchbay import ROOT
from patchbay.measure import exact
from patchbay.series import series, upstream
from patchbay.series.gitutil import git

pytestmark = pytest.mark.engine

TOY_HEADER = """Description: A toy numerics change that ignores its knob (for the test only).
Knob: PB_TOY type=bool default=0
Per-Request: no
Status: opt-in
Exactness: same-bits
Gain: none measured
Depends: none
Modules: none
Upstream-Status: Inappropriate [test fixture]
Last-Update: 2026-11-29
---
"""


def patchbay(*args, timeout=900):
    return subprocess.run([sys.executable, "-m", "patchbay", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def test_first_token_difference():
    assert exact.first_token_difference([1, 2, 3], [1, 2, 3]) is None
    assert exact.first_token_difference([1, 2, 3], [1, 5, 3]) == 1
    assert exact.first_token_difference([1, 2], [1, 2, 3]) == 2


def test_exact_on_a_live_server_passes(server_on):
    proc = patchbay("exact", "--url", server_on.url, "--knob", "PB_SSE_DONE=0,1", "--knob", "PB_FINGERPRINT=0,1",
                    "--batched", "3")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "24 same, 0 different" in proc.stdout
    assert "next to 3 others == alone" in proc.stdout


def test_exact_compares_two_servers(server_on, tmp_path):
    """--b-url: each exactness prompt's greedy reply from a second server, tokens named by A's
    /tokenize. The same engine under another address must agree on all eight."""
    import json

    other = server_on.url.replace("127.0.0.1", "localhost")
    out = tmp_path / "rows.json"
    proc = patchbay("exact", "--url", server_on.url, "--b-url", other, "--max-tokens", "24", "--json", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 same, 0 different" in proc.stdout
    rows = json.loads(out.read_text())
    assert len(rows) == 8 and all(r["equal"] and r["detail"].endswith("reply tokens") for r in rows)
    assert max(int(r["detail"].split()[0]) for r in rows) > 16  # --max-tokens reached the server


def test_exact_against_a_second_server_refuses_bad_input_in_one_line(server_on):
    from ..conftest import free_port

    gone = patchbay("exact", "--url", server_on.url, "--b-url", f"http://127.0.0.1:{free_port()}",
                    "--model", server_on.model, timeout=120)
    assert gone.returncode == 1 and "not reachable" in gone.stderr and "Traceback" not in gone.stderr
    alone = patchbay("exact", "--b-url", server_on.url)
    assert alone.returncode == 2 and "give --url" in alone.stderr
    short = patchbay("exact", "--url", server_on.url, "--b-url", server_on.url, "--max-tokens", "0")
    assert short.returncode == 2 and "--max-tokens 0" in short.stderr
    lone = patchbay("exact", "--url", server_on.url, "--batched", "1", "--b-model", "other")
    assert lone.returncode == 2 and "give --b-url" in lone.stderr


def toy_series(tmp_path):
    """A one-patch series that scales the routed experts' weights and ignores its knob."""
    lock = upstream.Lock.read()
    tree = series.scratch_copy(upstream.ensure(lock), tmp_path / "tree", lock.ref_tag)
    modeling = tree / "src/transformers/models/glm4_moe/modeling_glm4_moe.py"
    line = "topk_weights = topk_weights * self.routed_scaling_factor"
    assert modeling.read_text().count(line) == 1
    modeling.write_text(modeling.read_text().replace(line, line + " * 1.5"))
    diff = git(["diff", "--full-index"], tree).stdout
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0010-toy.patch").write_text(TOY_HEADER + diff)
    (patches / "series").write_text("0010-toy.patch\n")
    return patches


def test_a_non_exact_change_fails_naming_prompt_and_token(tmp_path, tiny_model):
    patches = toy_series(tmp_path)
    proc = patchbay("exact", "--pristine", "--series", str(patches), "--model-dir", tiny_model)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    diffs = [line for line in proc.stdout.splitlines() if " DIFF " in line]
    assert diffs, proc.stdout
    assert all(("token " in d and " != " in d) or "different logits" in d for d in diffs)
    assert "knobs unset == pristine (generate)" in proc.stdout


def test_teacher_forced_scores(tmp_path, tiny_model):
    """Same-bits: every |Δ logprob| is 0. The toy change: visibly non-zero, per text."""
    same = patchbay("score", "--b-knob", "PB_SSE_DONE=1", "--model-dir", tiny_model)
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines()[-1].split()[2:] == ["0", "0"]
    toy = patchbay("score", "--a-series", "pristine", "--b-series", str(toy_series(tmp_path)),
                   "--model-dir", tiny_model)
    assert toy.returncode == 0, toy.stderr
    rows = [line.split() for line in toy.stdout.splitlines()[1:]]
    assert all(float(r[2]) > 0 and float(r[3]) >= float(r[2]) for r in rows)
    bad = patchbay("score", "--b-knob", "PB_NOPE=1", "--model-dir", tiny_model)
    assert bad.returncode == 2 and "PB_NOPE is not a knob" in bad.stderr


def test_score_through_servers_refuses_bad_input_in_one_line():
    from ..conftest import free_port

    gone = patchbay("score", "--url", f"http://127.0.0.1:{free_port()}", "--model", "m", "--together", timeout=120)
    assert gone.returncode == 1 and "is not reachable" in gone.stderr and "Traceback" not in gone.stderr
    both = patchbay("score", "--url", "http://127.0.0.1:9", "--b-url", "http://127.0.0.1:9", "--together")
    assert both.returncode == 2 and "exactly one of --b-url URL" in both.stderr
    local = patchbay("score", "--together")
    assert local.returncode == 2 and "give --url too" in local.stderr
    local = patchbay("score", "--b-model", "other")
    assert local.returncode == 2 and "give --url too" in local.stderr
    mixed = patchbay("score", "--url", "http://127.0.0.1:9", "--together", "--b-knob", "PB_SSE_DONE=1")
    assert mixed.returncode == 2 and "do not apply" in mixed.stderr

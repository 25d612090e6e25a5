"""`python -m patchbay`: exit codes and one-line errors, run as the operator runs it."""

import subprocess
import sys

import pytest

from patchbay import ROOT


def patchbay(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "patchbay", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


def assert_one_line_error(proc, code, *parts):
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for part in parts:
        assert part in lines[0]


def test_check_passes_on_the_real_series():
    proc = patchbay("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("series ok: ")
    assert "zero fuzz" in proc.stdout and "build id pb-" in proc.stdout


def test_docs_check_passes():
    proc = patchbay("docs", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split("\n")[:2] == ["docs/PATCHES.md is up to date", "README.md is up to date"]


@pytest.mark.parametrize("verb", ["status", "start"])
def test_missing_config_is_exit_2_in_one_line(verb):
    proc = patchbay(verb, "--config", "/nonexistent")
    assert_one_line_error(proc, 2, f"patchbay {verb}: ", "/nonexistent", "no such config file")


def test_bad_config_value_is_exit_2_naming_the_key(tmp_path):
    path = tmp_path / "bad.env"
    path.write_text("PORT=abc\n")
    proc = patchbay("status", "--config", str(path))
    assert_one_line_error(proc, 2, f"{path}: PORT=abc is not an integer")


def test_synth_air12_without_a_gpu_is_exit_2_in_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine can build air12")
    proc = patchbay("synth", "air12", str(tmp_path / "x"))
    assert_one_line_error(proc, 2, "patchbay synth: ", "air12", "no CUDA device")
    assert not (tmp_path / "x").exists()


def test_synth_tiny_writes_the_context_asked_for_and_refuses_one_out_of_range(tmp_path):
    import json

    proc = patchbay("synth", "tiny", str(tmp_path / "t"), "--context", "2048")
    assert proc.returncode == 0 and "(seed 0, context 2048)" in proc.stdout, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "t" / "config.json").read_text())["max_position_embeddings"] == 2048
    assert json.loads((tmp_path / "t" / "tokenizer_config.json").read_text())["model_max_length"] == 2048
    proc = patchbay("synth", "tiny", str(tmp_path / "u"), "--context", "64")
    assert_one_line_error(proc, 2, "patchbay synth: ", "SYNTH_CONTEXT=64 is out of range")
    assert not (tmp_path / "u").exists()


def test_docker_verbs_refuse_the_local_runtime_in_one_line(tmp_path):
    cfg = tmp_path / "local.env"
    cfg.write_text("RUNTIME=local\nPORT=18123\n")
    proc = patchbay("preflight", "--config", str(cfg))
    assert_one_line_error(proc, 2, "RUNTIME=local; this verb is for RUNTIME=docker")


@pytest.mark.parametrize("args", [["--unhealthy", "0"], ["--interval", "-1"]])
def test_watch_refuses_a_bad_count_or_interval_in_one_line(args, tmp_path):
    cfg = tmp_path / "local.env"
    cfg.write_text(f"RUNTIME=local\nPORT=18123\nRUN_DIR={tmp_path / 'run'}\n")
    proc = patchbay("watch", "--once", "--config", str(cfg), *args)
    assert_one_line_error(proc, 2, "patchbay watch: ", "--unhealthy must be 1 or more")
    assert not (tmp_path / "run").exists()  # nothing was started


def test_a_docker_config_with_a_bad_node_is_exit_2_in_one_line(tmp_path):
    cfg = tmp_path / "pair.env"
    cfg.write_text("RUNTIME=docker\nTP=2\nWORKER=gpu-node-2\nPB_TENSOR_PARALLEL=1\n")
    proc = patchbay("preflight", "--config", str(cfg))
    assert_one_line_error(proc, 2, "WORKER=gpu-node-2 is not a node (allowed: local, ssh://user@host")


def test_the_rebase_report_in_docs_is_current():
    """docs/REBASE-5.24.0.md is regenerated like PATCHES.md (the next release's sdist, sha256-recorded,
    is fetched through pip the first time)."""
    proc = patchbay("rebase", "--to", "5.24.0", "--out", "docs/REBASE-5.24.0.md", "--check", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "is up to date" in proc.stdout
    assert patchbay("rebase", "--to", "5.24.0", "--check").returncode == 2

"""The GPU machine's servers, here on the CPU: a checkpoint as tensor-parallel ranks."""

import pytest

from patchbay.device import servers


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


def test_an_arms_engine_replaces_the_carried_ones_on_the_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/tmp/pb-engine-patched:/tmp/pb-site:/repo/src")
    assert servers.engine_path("/tmp/before") == "/tmp/before:/tmp/pb-site:/repo/src"
    monkeypatch.delenv("PYTHONPATH")
    assert servers.engine_path("/tmp/before") == "/tmp/before"


def test_fp8_models_are_served_only_with_their_knob(patched_engine, monkeypatch):
    """`serve --model synthetic:air12-fp8` (or full-size Air in FP8) without PB_FP8_WEIGHTS stops at
    once, saying why, before it builds anything; a name it does not know is refused too."""
    import subprocess
    import sys

    from ..conftest import engine_environ

    env = engine_environ(patched_engine)
    for model in ("synthetic:air12-fp8", "synthetic:air-fp8"):
        proc = subprocess.run([sys.executable, "-m", "patchbay.device", "serve", "--model", model], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and f"{model} is served with PB_FP8_WEIGHTS=1" in proc.stderr, proc.stderr
    with pytest.raises(ValueError, match="not one of synthetic:air12, synthetic:air12-fp8"):
        servers.build_model("synthetic:air13")

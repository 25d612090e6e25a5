"""RUNTIME=docker on a real Docker engine: the offline base, the serving image, the streamed copy,
preflight failures with their fixes, the pair's start / status / logs / watch / stop.

Two "nodes" are two containers on this machine's host network (127.0.0.1 only, own ports).
Without a Docker engine these tests skip, unless PATCHBAY_REQUIRE_DOCKER=1 (CI), where they fail.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from patchbay import ROOT
from patchbay.runtime.docker import image
from patchbay.series import series as series_mod
from patchbay.runtime.docker.pair import KERNEL_CACHE_DIR
from patchbay.series.upstream import LOCK_PATH

from ...conftest import ALL_ON, free_port

pytestmark = pytest.mark.docker
CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


@pytest.fixture(scope="module")
def client():
    try:
        import docker

        c = docker.from_env(timeout=900)
        c.ping()
        return c
    except Exception as e:  # no SDK or no engine
        message = f"no Docker engine ({type(e).__name__}: {str(e)[:120]}); scripts/dockerd.sh starts one"
        if os.environ.get("PATCHBAY_REQUIRE_DOCKER") == "1":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(scope="module")
def base(client):
    return image.ensure_base(client, progress=lambda *_: None)


@pytest.fixture(scope="module")
def the_series():
    loaded, problems = series_mod.load()
    assert not problems
    return loaded


@pytest.fixture(scope="module")
def build_id(the_series):
    return "pb-" + the_series.build_id(LOCK_PATH)


@pytest.fixture(scope="module")
def served_image(client, base, the_series):
    tag, _ = image.build_image(client, the_series, progress=lambda *_: None)
    return tag


def patchbay(*args, timeout=600):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PATCHBAY_")}
    return subprocess.run([sys.executable, "-m", "patchbay", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)


def write_env(tmp_path, name="pair.env", worker="", knobs=None, **settings):
    from patchbay.runtime import synth

    # SYNTH_CONTEXT: the test model's, so the pair serves server_on's checkpoint (tiny_model)
    values = {"MODEL": "synthetic:tiny", "SYNTH_CONTEXT": str(synth.TINY_CONTEXT), "HOST": "127.0.0.1", "PORT": str(free_port()), "RUNTIME": "docker",
              "HEAD": "local", "WORKER": worker, "RDZV_PORT": str(free_port()), "READY_TIMEOUT": "300",
              "PAIR": f"pbtest-{os.getpid()}", "ENGINE_ARGS": "--cb-num-blocks 64 --cb-max-batch-tokens 1024",
              **settings}
    knobs = dict(ALL_ON if knobs is None else knobs)
    if worker:  # one rank per node, tensor parallel over the loopback interface
        values.update({"GLOO_IFNAME": "lo", "TP": "2"})
        knobs["PB_TENSOR_PARALLEL"] = "1"
    lines = [f"{k}={v}" for k, v in values.items() if v != ""]
    lines += [f"{k}={v}" for k, v in knobs.items()]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path, values


def pair_containers(client, prefix: str) -> list[str]:
    return [c.name for c in client.containers.list(all=True) if c.name.startswith(prefix)]


def chat(port: int, model: str, max_tokens: int = 12) -> dict:
    r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120,
                   json={"model": model, "messages": CHAT, "max_tokens": max_tokens})
    r.raise_for_status()
    return r.json()


# ---- images ---------------------------------------------------------------------------------


def test_base_image_is_cached_by_content(client, base):
    said = []
    t0 = time.monotonic()
    assert image.ensure_base(client, progress=said.append) == base
    assert time.monotonic() - t0 < 10
    assert said and "already built" in said[0]
    assert base.split(":")[1] == image.base_key(image.apt_mirror(), image.pinned("engine", "torch"))


def test_image_is_labelled_and_rebuilt_only_when_the_series_changes(client, served_image, the_series, build_id):
    assert served_image == f"patchbay:{build_id}"
    assert image.build_image(client, the_series, progress=lambda *_: None) == (served_image, False)
    labels = client.images.get(served_image).labels
    assert labels["org.patchbay.build"] == build_id
    assert labels["org.patchbay.upstream"].startswith("transformers 5.23.0 sdist-sha256:19d647a4")
    assert json.loads(labels["org.patchbay.patches"]) == [p.path.name for p in the_series.patches]
    assert set(json.loads(labels["org.patchbay.knobs"])["knobs"]) == {k.name for k in the_series.knobs()}
    assert labels["org.patchbay.commit"]
    assert labels["org.patchbay.recipe"] == image.recipe_hash()  # patchbay's own code in the image


def test_image_keeps_the_base_torch_and_runs_the_patched_build(client, served_image, base, build_id):
    probe = ("import torch, json, transformers._pb.build_info as b; "
             "print(torch.__version__, json.loads(b.BUILD_JSON)['build_id'])")
    in_image = client.containers.run(served_image, ["python3", "-c", probe], remove=True).decode().split()
    in_base = client.containers.run(base, ["python3", "-c", "import torch; print(torch.__version__)"],
                                    remove=True).decode().split()
    assert in_image == [in_base[0], build_id]


def test_build_verb_skips_a_built_image_and_says_the_worker_shares_the_engine(tmp_path, served_image, build_id):
    path, _ = write_env(tmp_path, worker="local")
    out = patchbay("build", "--config", str(path))
    assert out.returncode == 0, out.stderr
    assert f"{build_id}: image {served_image} already built" in out.stdout
    assert "worker: same Docker engine as the head (local); nothing to copy" in out.stdout


def test_copy_streams_save_into_load_and_checks_the_label(client, served_image, build_id):
    as_tag = f"patchbay-copytest:{build_id}"
    try:
        assert image.copy_image(client, client, served_image, build_id, as_tag=as_tag, progress=lambda *_: None)
        assert client.images.get(as_tag).labels["org.patchbay.build"] == build_id
        assert not image.copy_image(client, client, served_image, build_id, as_tag=as_tag)  # already there
        with pytest.raises(image.ImageError, match="is not on the head node"):
            image.copy_image(client, client, served_image, "pb-000000000000", as_tag="patchbay-copytest:x")
    finally:
        client.images.remove(as_tag, noprune=True)


# ---- preflight ------------------------------------------------------------------------------


def test_preflight_passes_and_reuses_the_verified_manifest(tmp_path, served_image):
    path, _ = write_env(tmp_path)
    patchbay("preflight", "--config", str(path))
    out = patchbay("preflight", "--config", str(path))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "preflight: all PASS" in out.stdout
    assert "0 hashed" in out.stdout and "from the cached manifest" in out.stdout


def _busy_port(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    return s, {"PORT": str(s.getsockname()[1])}


@pytest.mark.parametrize("case, expected", [
    ("bad knob", "fix: remove or rename the PB_NOPE line"),
    ("bad value", "PB_SSE_DONE=2 is not a valid value (allowed: 0, 1); fix: correct the PB_SSE_DONE line"),
    ("missing model", "does not exist on this node; fix: put the checkpoint at that path on the node"),
    ("busy port", "is in use (Address already in use); fix: stop what listens there"),
])
def test_start_fails_in_preflight_with_the_named_fix(client, tmp_path, served_image, case, expected):
    held = None
    knobs, settings = dict(ALL_ON), {}
    if case == "bad knob":
        knobs["PB_NOPE"] = "1"
    elif case == "bad value":
        knobs["PB_SSE_DONE"] = "2"
    elif case == "missing model":
        settings["MODEL"] = str(tmp_path / "no-such-model")
    else:
        held, settings = _busy_port(tmp_path)
    try:
        path, values = write_env(tmp_path, knobs=knobs, **settings)
        out = patchbay("start", "--config", str(path))
    finally:
        if held:
            held.close()
    assert out.returncode == 1
    assert "patchbay start: preflight failed:" in out.stderr and expected in out.stderr, out.stderr
    assert "FAIL" in out.stderr  # the table goes with it
    assert not pair_containers(client, values["PAIR"])
    assert not (tmp_path / "no-such-model").exists()  # a bind mount never creates the folder


# ---- serving --------------------------------------------------------------------------------


def test_one_rank_serves_like_the_local_engine_and_the_watchdog_restarts_it(client, tmp_path, served_image,
                                                                             server_on):
    path, values = write_env(tmp_path)
    port, pair = int(values["PORT"]), values["PAIR"]
    try:
        out = patchbay("start", "--config", str(path))
        assert out.returncode == 0, out.stderr
        assert f"on http://127.0.0.1:{port} (1 rank(s)" in out.stdout
        model = server_on.model
        assert chat(port, model)["choices"][0]["message"] == chat(server_on.cfg.port, model)["choices"][0]["message"]

        st = patchbay("status", "--config", str(path))
        assert st.returncode == 0 and "health    ok" in st.stdout and f"{pair}-rank0  running" in st.stdout
        again = patchbay("start", "--config", str(path))
        assert again.returncode == 1 and "already running" in again.stderr
        assert "Application startup complete" in patchbay("logs", "--config", str(path), "-n", "200").stdout

        # Triton's kernel cache is the node's volume, so what one rank compiled is there after a restart
        rank0 = client.containers.get(f"{pair}-rank0")
        probe = f"{KERNEL_CACHE_DIR}/probe-{pair}"
        assert rank0.exec_run(["sh", "-c", f'test "$TRITON_CACHE_DIR" = {KERNEL_CACHE_DIR} && touch {probe}']).exit_code == 0
        rank0.kill()
        t0 = time.monotonic()
        st = patchbay("status", "--config", str(path))
        assert time.monotonic() - t0 < 5
        assert st.returncode == 1 and "exited (137)" in st.stdout, st.stdout

        w = patchbay("watch", "--once", "--config", str(path))
        assert w.returncode == 0, w.stdout + w.stderr
        assert "restarting the pair (rank 0 exited (137))" in w.stdout
        assert patchbay("status", "--config", str(path)).returncode == 0
        assert chat(port, model)["choices"][0]["message"]["content"]
        restarted = client.containers.get(f"{pair}-rank0")
        assert restarted.id != rank0.id
        assert restarted.exec_run(["test", "-f", probe]).exit_code == 0
        assert restarted.exec_run(["rm", probe]).exit_code == 0
    finally:
        stop = patchbay("stop", "--config", str(path))
    assert stop.returncode == 0 and f"removed {pair}-rank0 on the head" in stop.stdout
    assert not pair_containers(client, pair)
    assert patchbay("status", "--config", str(path)).returncode == 3
    assert "not running" in patchbay("stop", "--config", str(path)).stdout
    # Restarts and stops keep the verified weights manifest (its own volume): nothing is re-hashed.
    assert "(0 hashed, " in patchbay("preflight", "--config", str(path)).stdout


def test_two_ranks_reply_like_one_a_dead_worker_is_a_503_and_the_watchdog_restarts_the_pair(client, tmp_path, served_image, server_on):
    path, values = write_env(tmp_path, worker="local")
    port, pair = int(values["PORT"]), values["PAIR"]
    try:
        out = patchbay("start", "--config", str(path))
        assert out.returncode == 0, out.stderr
        assert "(2 rank(s)" in out.stdout
        model = server_on.model
        assert chat(port, model)["choices"][0]["message"] == chat(server_on.cfg.port, model)["choices"][0]["message"]
        st = patchbay("status", "--config", str(path))
        assert st.returncode == 0 and f"{pair}-rank1  running" in st.stdout, st.stdout

        client.containers.get(f"{pair}-rank1").kill()
        t0 = time.monotonic()
        st = patchbay("status", "--config", str(path))
        assert time.monotonic() - t0 < 5
        assert st.returncode == 1 and f"{pair}-rank1  exited" in st.stdout, st.stdout
        deadline = time.monotonic() + 10
        code = None
        while time.monotonic() < deadline and code != 503:
            code = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=10,
                              json={"model": model, "messages": CHAT, "max_tokens": 4}).status_code
        assert code == 503

        w = patchbay("watch", "--once", "--config", str(path))  # the watchdog brings the pair back
        assert w.returncode == 0 and "restarting the pair (rank 1 exited (137))" in w.stdout, w.stdout + w.stderr
        st = patchbay("status", "--config", str(path))
        assert st.returncode == 0 and f"{pair}-rank1  running" in st.stdout, st.stdout
        assert chat(port, model)["choices"][0]["message"]["content"]
    finally:
        patchbay("stop", "--config", str(path))
    assert not pair_containers(client, pair)


@pytest.mark.parametrize("case", ["a rank exits", "readiness times out"])
def test_start_is_atomic_both_ranks_go_and_their_last_lines_are_shown(client, tmp_path, served_image, case):
    settings = {"ENGINE_ARGS": "--cb-num-blocks 64 --no-such-flag"} if case == "a rank exits" else \
        {"READY_TIMEOUT": "2"}
    path, values = write_env(tmp_path, worker="local", **settings)
    try:
        out = patchbay("start", "--config", str(path))
    finally:
        patchbay("stop", "--config", str(path))
    assert out.returncode == 1
    if case == "a rank exits":
        assert "exited before the pair was ready" in out.stderr and "no-such-flag" in out.stderr, out.stderr
    else:
        assert "no streamed token within 2s (READY_TIMEOUT); both ranks removed" in out.stderr, out.stderr
    assert "rank 0 (head" in out.stderr and "rank 1 (worker" in out.stderr
    assert not pair_containers(client, values["PAIR"])

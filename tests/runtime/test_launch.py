"""Operating the local runtime through the CLI, as an operator would, and the engine's own
refusal of bad knobs at start."""

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from patchbay import ROOT
from patchbay.runtime import config, launch
from patchbay.runtime.launch import engine_command, engine_env

from ..conftest import LOCAL, free_port

pytestmark = pytest.mark.engine


def patchbay(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "patchbay", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def write_config(tmp_path, **overrides) -> str:
    lines = (config.CONFIG_DIR / "local.env.example").read_text().splitlines()
    keys = {k.upper() for k in overrides}
    kept = [line for line in lines if line.partition("=")[0] not in keys]
    path = tmp_path / "test.env"
    path.write_text("\n".join(kept + [f"{k.upper()}={v}" for k, v in overrides.items()]) + "\n")
    return str(path)


def assert_one_line_error(proc, code: int, *words: str):
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    for word in words:
        assert word in lines[0]


def test_start_status_twice_stop(tmp_path, patched_engine, tiny_model):
    cfg = write_config(tmp_path, port=free_port(), run_dir=str(tmp_path / "run"))
    started = patchbay("start", "--config", cfg)
    try:
        assert started.returncode == 0, started.stderr
        assert "serving" in started.stdout and patched_engine.build_id in started.stdout
        status = patchbay("status", "--config", cfg)
        assert status.returncode == 0
        assert "health    ok" in status.stdout and "PB_SSE_DONE=1" in status.stdout
        assert_one_line_error(patchbay("start", "--config", cfg), 1, "already running", "stop")
        logs = patchbay("logs", "--config", cfg, "-n", "100000")
        assert f"patchbay build {patched_engine.build_id}: knobs on: " in logs.stdout
        assert "PB_CONTEXT_LIMIT=1" in logs.stdout.split("knobs on: ", 1)[1].splitlines()[0]
    finally:
        stopped = patchbay("stop", "--config", cfg)
    assert stopped.returncode == 0 and "stopped pid" in stopped.stdout
    assert patchbay("status", "--config", cfg).returncode == 3
    assert patchbay("stop", "--config", cfg).stdout.strip() == "not running"


def test_busy_port_is_named(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = write_config(tmp_path, port=port, run_dir=str(tmp_path / "run"))
        assert_one_line_error(patchbay("start", "--config", cfg), 1, f"port {port}", "in use")


@pytest.mark.parametrize("line,code,words", [
    ("PB_NOT_A_KNOB=1", 2, ["PB_NOT_A_KNOB is not a knob of this series", "PB_SSE_DONE"]),
    ("PB_SSE_DONE=yes", 2, ["PB_SSE_DONE=yes is not a valid value (allowed: 0, 1)"]),
    ("this is not a setting", 2, ["expected KEY=VALUE"]),
    ("COLOUR=blue", 2, ["unknown setting COLOUR"]),
])
def test_bad_config_is_one_line(tmp_path, line, code, words):
    path = tmp_path / "bad.env"
    path.write_text(f"PORT={free_port()}\nRUN_DIR={tmp_path / 'run'}\n{line}\n")
    assert_one_line_error(patchbay("start", "--config", str(path)), code, *words)


def test_missing_config_is_one_line(tmp_path):
    assert_one_line_error(patchbay("start", "--config", str(tmp_path / "nope.env")), 2, "no such config file")


@pytest.mark.parametrize("env,words", [
    ({"PB_SSE_DONE": "yes"}, ["PB_SSE_DONE=yes is not a valid value (allowed: 0, 1)"]),
    ({"PB_MISSPELT": "1"}, ["PB_MISSPELT is not a knob of this build", "PB_TOKENIZE"]),
])
def test_engine_refuses_bad_knobs_at_start(patched_engine, tiny_model, env, words):
    """The engine checks on its own, whoever starts it: one line, exit 2, before loading."""
    cfg = LOCAL
    proc = subprocess.run(engine_command(cfg, tiny_model), env={**engine_env(patched_engine, {}), **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "refusing to start" in proc.stderr and "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr


class Health(BaseHTTPRequestHandler):
    """/health as an engine answers it, by the path: /ok/health, /503/health, /text/health."""
    seen: list = []

    def do_GET(self):
        Health.seen.append(dict(self.headers))
        kind = self.path.split("/")[1]
        code, body = {"ok": (200, b'{"status": "ok"}'),
                      "503": (503, b'{"status": "unhealthy", "reason": "tp_peer_lost", "error": "rank 1 is gone"}'),
                      "text": (500, b"Internal Server Error")}[kind]
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        Health.seen.append(dict(self.headers))
        self.send_response(404)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_health_sends_the_headers_given_and_names_the_reason():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert launch.health(f"{base}/ok", headers={"Authorization": "Bearer k"}) == "ok"
        assert Health.seen[-1]["Authorization"] == "Bearer k"
        assert launch.health(f"{base}/503") == "unhealthy (HTTP 503: tp_peer_lost: rank 1 is gone)"
        assert "Authorization" not in Health.seen[-1]
        assert launch.health(f"{base}/text") == "unhealthy (HTTP 500: Internal Server Error)"
        assert not launch.first_streamed_token(f"{base}/ok", "m", headers={"Authorization": "Bearer k2"})
        assert Health.seen[-1]["Authorization"] == "Bearer k2"
    finally:
        server.shutdown()
        server.server_close()
    assert launch.health(base).startswith("unreachable (")


def test_busy_port_is_named(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        cfg = write_config(tmp_path, port=port, run_dir=str(tmp_path / "run"))
        assert_one_line_error(patchbay("start", "--config", cfg), 1, f"port {port}", "in use")


@pytest.mark.parametrize("line,code,words", [
    ("PB_NOT_A_KNOB=1", 2, ["PB_NOT_A_KNOB is not a knob of this series", "PB_SSE_DONE"]),
    ("PB_SSE_DONE=yes", 2, ["PB_SSE_DONE=yes is not a valid value (allowed: 0, 1)"]),
    ("this is not a setting", 2, ["expected KEY=VALUE"]),
    ("COLOUR=blue", 2, ["unknown setting COLOUR"]),
])
def test_bad_config_is_one_line(tmp_path, line, code, words):
    path = tmp_path / "bad.env"
    path.write_text(f"PORT={free_port()}\nRUN_DIR={tmp_path / 'run'}\n{line}\n")
    assert_one_line_error(patchbay("start", "--config", str(path)), code, *words)


def test_missing_config_is_one_line(tmp_path):
    assert_one_line_error(patchbay("start", "--config", str(tmp_path / "nope.env")), 2, "no such config file")


@pytest.mark.parametrize("env,words", [
    ({"PB_SSE_DONE": "yes"}, ["PB_SSE_DONE=yes is not a valid value (allowed: 0, 1)"]),
    ({"PB_MISSPELT": "1"}, ["PB_MISSPELT is not a knob of this build", "PB_TOKENIZE"]),
])
def test_engine_refuses_bad_knobs_at_start(patched_engine, tiny_model, env, words):
    """The engine checks on its own, whoever starts it: one line, exit 2, before loading."""
    cfg = LOCAL
    proc = subprocess.run(engine_command(cfg, tiny_model), env={**engine_env(patched_engine, {}), **env},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "refusing to start" in proc.stderr and "Traceback" not in proc.stderr
    for word in words:
        assert word in proc.stderr

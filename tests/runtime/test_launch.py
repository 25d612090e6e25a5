"""Operating the local runtime through the CLI, as an operator would (status tells a crash from a
stop, and an unhealthy server from a healthy one), and the engine's own refusal of bad knobs at
start."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
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
    time.sleep(1)  # a record written after the stop had cleared the run folder would show now
    status = patchbay("status", "--config", cfg)
    assert status.returncode == 3 and status.stdout == "not running\n", status.stdout
    assert not list((tmp_path / "run").glob("server*.exit.json"))
    assert patchbay("stop", "--config", cfg).stdout.strip() == "not running"


def test_a_killed_engine_is_a_crash_with_its_signal_and_last_lines_until_stop(tmp_path, patched_engine, tiny_model):
    run = tmp_path / "run"
    cfg = write_config(tmp_path, port=free_port(), run_dir=str(run))
    started = patchbay("start", "--config", cfg)
    try:
        assert started.returncode == 0, started.stderr
        pid = launch.running(launch.RunFiles(run))["pid"]
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        while launch._alive(pid):
            time.sleep(0.05)
        for _ in range(2):  # reading the status does not use the record up
            status = patchbay("status", "--config", cfg)
            assert status.returncode == 1, status.stdout + status.stderr
            first = status.stdout.splitlines()[0]
            assert first.startswith("crashed: exit code -9 (SIGKILL) at ") and first.endswith("; last log lines:")
            at = time.mktime(time.strptime(first.split(" at ")[1].split(";")[0], "%Y-%m-%d %H:%M:%S"))
            assert abs(at - killed) < 5
            assert "Uvicorn running on" in status.stdout  # the log's tail
        assert patchbay("start", "--config", cfg).returncode == 0  # a start after a crash needs no stop
        assert patchbay("status", "--config", cfg).returncode == 0
    finally:
        patchbay("stop", "--config", cfg)
    status = patchbay("status", "--config", cfg)
    assert status.returncode == 3 and status.stdout == "not running\n"


def test_a_crash_is_cleared_by_stop(tmp_path):
    """Without an engine: a pid file whose process is gone and its reaper's record."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = write_config(tmp_path, port=free_port(), run_dir=str(run))
    gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(7)"])
    gone.wait()
    files = launch.RunFiles(run)
    files.pid.write_text(f"{gone.pid}\n")
    (run / "server.log").write_text("the last thing it said\n")
    status = patchbay("status", "--config", cfg)
    assert status.returncode == 1
    assert status.stdout.startswith(f"crashed: pid {gone.pid} is gone (no exit status recorded); last log lines:\n"
                                    "the last thing it said\n"), status.stdout
    files.rank_exit(0).write_text(json.dumps({"pid": gone.pid, "code": 7, "signal": None, "at": time.time()}))
    assert patchbay("status", "--config", cfg).stdout.startswith("crashed: exit code 7 at ")
    stopped = patchbay("stop", "--config", cfg)
    assert stopped.returncode == 0 and stopped.stdout.startswith("not running (it had crashed: exit code 7 at ")
    status = patchbay("status", "--config", cfg)
    assert status.returncode == 3 and status.stdout == "not running\n"


# Upstream's batching worker dies on an empty prompt alone in a step, and the server lingers
# answering 503. Production's knobs refuse the prompt (0500) and exit a server whose worker died
# (0510); these tests turn both off to get the lingering server a supervisor must notice.
LINGERS = {"pb_api_errors": "0", "pb_fault_isolation": "0"}


def served_model(url: str) -> str:
    """The model id the server at `url` lists (GET /v1/models): the one its clients name."""
    return httpx.get(f"{url}/v1/models", timeout=30).json()["data"][0]["id"]


def kill_the_batching_worker(url: str) -> None:
    """With LINGERS' knobs the batching worker dies on an empty prompt; /health then answers 503."""
    r = httpx.post(f"{url}/v1/completions", json={"model": served_model(url), "prompt": ""}, timeout=60)
    assert r.status_code in (500, 503), r.text  # the request fails as 503 or 500, as the race goes
    assert httpx.get(f"{url}/health", timeout=5).json()["reason"] == "cb_worker_dead"


def test_an_unhealthy_server_is_exit_1_with_the_reason(tmp_path, patched_engine):
    cfg = write_config(tmp_path, port=free_port(), run_dir=str(tmp_path / "run"), **LINGERS)
    started = patchbay("start", "--config", cfg)
    try:
        assert started.returncode == 0, started.stderr
        kill_the_batching_worker(launch.running(launch.RunFiles(tmp_path / "run"))["url"])
        status = patchbay("status", "--config", cfg)
        assert status.returncode == 1
        assert "health    unhealthy (HTTP 503: cb_worker_dead)" in status.stdout, status.stdout
    finally:
        patchbay("stop", "--config", cfg)


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


def test_tp2_status_reports_each_ranks_end(tmp_path, patched_engine, tiny_model):
    run = tmp_path / "run"
    cfg = write_config(tmp_path, port=free_port(), rdzv_port=free_port(), tp=2, pb_tensor_parallel=1,
                       run_dir=str(run))
    started = patchbay("start", "--config", cfg)
    try:
        assert started.returncode == 0, started.stderr
        ranks = launch.running(launch.RunFiles(run))["ranks"]
        os.kill(ranks[1]["pid"], signal.SIGKILL)
        while launch._alive(ranks[1]["pid"]):
            time.sleep(0.05)
        status = patchbay("status", "--config", cfg)
        assert status.returncode == 1, status.stdout
        rows = dict(re.fullmatch(r"(rank \d)\s+(.*)", line).groups() for line in status.stdout.splitlines()
                    if line.startswith("rank "))
        assert rows["rank 0"] == f"pid {ranks[0]['pid']} alive (HTTP)", status.stdout
        assert rows["rank 1"].startswith(f"pid {ranks[1]['pid']} DEAD: exit code -9 (SIGKILL) at "), status.stdout
        assert f"--- rank 1 ({run / 'server.rank1.log'}) ---" in status.stdout  # its last lines
        assert "--- rank 0" not in status.stdout

        os.kill(ranks[0]["pid"], signal.SIGTERM)  # rank 0 ends too, without a stop
        while launch._alive(ranks[0]["pid"]):
            time.sleep(0.05)
        status = patchbay("status", "--config", cfg)
        assert status.returncode == 1
        first = status.stdout.splitlines()[0]
        assert re.fullmatch(r"crashed: rank 0 exit code -?\d+( \(SIG[A-Z]+\))? at [-0-9: ]+; rank 1 exit code -9 \(SIGKILL\) at "
                            r"[-0-9: ]+; last log lines:", first), first
        assert "--- rank 0" in status.stdout and "--- rank 1" in status.stdout
    finally:
        stopped = patchbay("stop", "--config", cfg)
    assert stopped.stdout.startswith("not running (it had crashed: rank 0 exit code"), stopped.stdout
    assert patchbay("status", "--config", cfg).returncode == 3

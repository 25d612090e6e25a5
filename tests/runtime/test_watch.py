"""The local runtime's watchdog (`watch`, runtime.watch's loop) through the CLI on the tiny model:
it starts a server when none runs, restarts one that was killed, and one whose health checks
failed N times in a row, reading the config again each time; quiet while all is well."""

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from patchbay import ROOT
from patchbay.runtime import launch

from ..conftest import free_port
from .test_launch import LINGERS, kill_the_batching_worker, patchbay, served_model, write_config

pytestmark = pytest.mark.engine

STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d watch: ")


def chat(url: str) -> str:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120,
                   json={"model": served_model(url), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_watch_once_starts_a_server_then_restarts_a_killed_one_with_the_config_read_again(
        tmp_path, patched_engine):
    run = tmp_path / "run"
    cfg = write_config(tmp_path, port=free_port(), run_dir=str(run))
    files = launch.RunFiles(run)
    try:
        w = patchbay("watch", "--once", "--config", cfg)
        assert w.returncode == 0, w.stdout + w.stderr
        lines = w.stdout.splitlines()
        assert len(lines) == 2 and all(STAMPED.match(line) for line in lines), w.stdout
        assert lines[0].endswith("watch: restarting the server (not running)")
        assert "watch: serving " in lines[1]
        assert patchbay("status", "--config", cfg).returncode == 0
        first = launch.running(files)["pid"]

        quiet = patchbay("watch", "--once", "--config", cfg)
        assert quiet.returncode == 0 and quiet.stdout == ""  # nothing to do, nothing said
        assert launch.running(files)["pid"] == first

        os.kill(first, signal.SIGKILL)
        while launch._alive(first):
            time.sleep(0.05)
        with open(cfg, "a") as f:
            f.write("PB_SSE_DONE=0\n")  # read again for the restart
        w = patchbay("watch", "--once", "--config", cfg)
        assert w.returncode == 0, w.stdout + w.stderr
        assert "watch: restarting the server (crashed: exit code -9 (SIGKILL) at " in w.stdout, w.stdout
        status = patchbay("status", "--config", cfg)
        assert status.returncode == 0 and "PB_SSE_DONE=0" in status.stdout, status.stdout
        info = launch.running(files)
        assert info["pid"] != first
        assert chat(info["url"])
    finally:
        patchbay("stop", "--config", cfg)
    assert patchbay("status", "--config", cfg).returncode == 3


def test_watch_restarts_a_server_after_n_failed_health_checks(tmp_path, patched_engine):
    run = tmp_path / "run"
    cfg = write_config(tmp_path, port=free_port(), run_dir=str(run), **LINGERS)
    files = launch.RunFiles(run)
    started = patchbay("start", "--config", cfg)
    watcher = None
    try:
        assert started.returncode == 0, started.stderr
        info = launch.running(files)
        watcher = subprocess.Popen([sys.executable, "-m", "patchbay", "watch", "--config", cfg, "--interval", "0.5",
                                    "--unhealthy", "3"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True)
        said: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [said.put(line.rstrip("\n")) for line in watcher.stdout], daemon=True).start()

        def next_line(timeout: float) -> str | None:
            try:
                return said.get(timeout=timeout)
            except queue.Empty:
                return None

        assert next_line(3.0) is None  # healthy: a few checks, not a word
        kill_the_batching_worker(info["url"])
        lines = [next_line(30.0) for _ in range(4)]
        assert all(line and STAMPED.match(line) for line in lines), lines
        assert lines[0].endswith("watch: health unhealthy (HTTP 503: cb_worker_dead) (1 of 3 failed checks before "
                                 "a restart)"), lines
        assert "(2 of 3 failed checks" in lines[1]
        assert lines[2].endswith("watch: restarting the server (health unhealthy (HTTP 503: cb_worker_dead), "
                                 "3 failed checks in a row)"), lines
        assert lines[3] is not None and "watch: serving " in lines[3]
        restarted = launch.running(files)
        assert restarted["pid"] != info["pid"] and launch.health(restarted["url"]) == "ok"
        assert chat(restarted["url"])
        assert next_line(2.0) is None  # healthy again: quiet again
    finally:
        if watcher is not None:
            watcher.terminate()  # the watchdog first, or it starts the server again
            watcher.wait(30)
        patchbay("stop", "--config", cfg)
    assert patchbay("status", "--config", cfg).returncode == 3

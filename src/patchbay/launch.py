"""start / stop / status / logs for the local runtime: one engine process on this machine.

Ready means a streamed token came back through the HTTP API, not that a port opened.
The run folder (.run/) holds the pid, the log and what was started (build, model, knobs).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from .build import Engine
from .config import Config



class LaunchError(RuntimeError):
    pass


@dataclass(frozen=True)
class RunFiles:
    dir: Path

    @property
    def pid(self) -> Path:
        return self.dir / "server.pid"

    @property
    def log(self) -> Path:
        return self.dir / "server.log"

    @property
    def info(self) -> Path:
        return self.dir / "server.json"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); it is not serving.
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.is_file() and stat.read_text().split(")")[-1].split()[0] == "Z")


def running(files: RunFiles) -> dict | None:
    """What was started, if its process is still alive; a stale pid file is removed."""
    if not files.pid.is_file():
        return None
    try:
        pid = int(files.pid.read_text().strip())
    except ValueError:
        pid = -1
    if pid > 0 and _alive(pid):
        info = json.loads(files.info.read_text()) if files.info.is_file() else {}
        return {**info, "pid": pid}
    files.pid.unlink(missing_ok=True)
    return None


def port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def engine_command(cfg: Config, model_path: str) -> list[str]:
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", model_path,
           "--host", cfg.host, "--port", str(cfg.port), "--device", cfg.device, "--log-level", "info"]
    if cfg.continuous_batching:
        cmd.append("--continuous-batching")
    return cmd + cfg.engine_args.split()


def engine_env(engine: Engine, knobs: dict[str, str], base: dict | None = None) -> dict[str, str]:
    """The engine's environment: its build first on the path, its knobs, nothing fetched."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith("PB_")}
    env.update(engine.env())
    env.update(knobs)
    env.update({"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
                "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
    return env


def log_tail(path: Path, lines: int = 20) -> str:
    if not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def first_streamed_token(url: str, model: str, timeout: float = 10.0) -> bool:
    """True once a streamed chat completion yields a first content token."""
    # No sampling fields: upstream's continuous batching fixes its sampling settings from
    # the first request it sees, and this probe must not choose them for the operator.
    body = {"model": model, "messages": [{"role": "user", "content": "ready?"}], "stream": True, "max_tokens": 1}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                return False
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices", []):
                    delta = choice.get("delta", {})
                    if delta.get("content") or delta.get("reasoning_content") or choice.get("finish_reason"):
                        return True
    except (httpx.HTTPError, json.JSONDecodeError):
        return False
    return False


def refuse_if_running(files: RunFiles) -> None:
    current = running(files)
    if current:
        raise LaunchError(f"already running (pid {current['pid']} on {current.get('url')}); "
                          "run `scripts/serve.sh stop` first")


def start(cfg: Config, engine: Engine, model_path: str, files: RunFiles, progress=print) -> dict:
    refuse_if_running(files)
    if not port_free(cfg.host, cfg.port):
        raise LaunchError(f"port {cfg.port} on {cfg.host} is in use by another process; stop it or set "
                          f"PORT= in {cfg.source}")
    files.dir.mkdir(parents=True, exist_ok=True)
    log = files.log.open("w")
    proc = subprocess.Popen(engine_command(cfg, model_path), env=engine_env(engine, cfg.knobs),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, cwd=files.dir)
    files.pid.write_text(f"{proc.pid}\n")
    info = {"url": cfg.url, "build_id": engine.build_id, "model": model_path, "knobs": cfg.knobs_on(),
            "config": cfg.source, "started": int(time.time())}
    files.info.write_text(json.dumps(info, indent=2) + "\n")
    progress(f"waiting for the first streamed token from {cfg.url} (log: {files.log})")
    deadline = time.monotonic() + cfg.ready_timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            files.pid.unlink(missing_ok=True)
            raise LaunchError(f"the engine exited with code {proc.returncode} before it was ready; "
                              f"last log lines:\n{log_tail(files.log)}")
        if first_streamed_token(cfg.url, model_path):
            return {**info, "pid": proc.pid}
        time.sleep(1.0)
    stop(files)
    raise LaunchError(f"no streamed token within {cfg.ready_timeout}s (READY_TIMEOUT); the engine was "
                      f"stopped; last log lines:\n{log_tail(files.log)}")


def stop(files: RunFiles, grace: float = 15.0) -> int | None:
    """Stop the engine's whole process group. Returns the pid stopped, None if none ran."""
    current = running(files)
    if not current:
        return None
    pid = current["pid"]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.2)
        if not _alive(pid):
            break
    files.pid.unlink(missing_ok=True)
    return pid


def health(url: str) -> str:
    try:
        r = httpx.get(f"{url}/health", timeout=5)
    except httpx.HTTPError as e:
        return f"unreachable ({type(e).__name__})"
    return "ok" if r.status_code == 200 else f"unhealthy (HTTP {r.status_code}: {r.text[:80]})"


class Alternation:
    """Two server configurations served in turn on one host and port: calling it with an arm
    stops whatever runs and starts that arm's configuration (for `ab` on knobs read at start)."""

    def __init__(self, configs: dict, engine: Engine, model_path: str, files: RunFiles):
        self.configs, self.engine, self.model, self.files = configs, engine, model_path, files
        self.url = next(iter(configs.values())).url

    def __call__(self, arm: str) -> None:
        self.stop()
        start(self.configs[arm], self.engine, self.model, self.files, progress=lambda *_: None)

    def stop(self) -> None:
        stop(self.files)

    def describe(self) -> dict:
        return {arm: {"config": c.source, "knobs": c.knobs_on(), "engine_args": c.engine_args}
                for arm, c in self.configs.items()}

"""start / stop / status / logs for the local runtime: the engine's processes on this machine.

One process, or with TP=N one per tensor-parallel rank, each in its own process group with
the standard torch.distributed environment; rank 0 serves HTTP. Ready means a streamed token
came back through rank 0's HTTP API, not that a port opened. Start is atomic: a rank that
exits or a readiness timeout stops every rank. The run folder (.run/) holds one pid and log
per rank and what was started (build, model, knobs).

Each rank runs under a small parent (reaper.py) that writes how the rank ended into the run
folder; `stop` removes that record, so one left behind is a rank that died without a stop (a
crash, a kill, an exit of its own), and `status` can say so and how.
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

from ..series.build import Engine
from . import procenv
from .config import Config

REAPER = Path(__file__).with_name("reaper.py")


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

    def rank_pid(self, rank: int) -> Path:
        return self.pid if rank == 0 else self.dir / f"server.rank{rank}.pid"

    def rank_log(self, rank: int) -> Path:
        return self.log if rank == 0 else self.dir / f"server.rank{rank}.log"

    def rank_exit(self, rank: int) -> Path:
        """How the rank's engine ended, written by its reaper; removed by stop and start."""
        return self.dir / ("server.exit.json" if rank == 0 else f"server.rank{rank}.exit.json")

    def pids(self) -> dict[int, int]:
        """rank -> pid, from the pid files there are."""
        found = {}
        for path in [self.pid, *sorted(self.dir.glob("server.rank*.pid"))]:
            rank = 0 if path == self.pid else int(path.name.split(".")[1][4:])
            try:
                found[rank] = int(path.read_text().strip())
            except (OSError, ValueError):
                continue
        return found

    def exits(self) -> list[int]:
        """The ranks with an exit record."""
        found = [0] if self.rank_exit(0).is_file() else []
        return found + sorted(int(p.name.split(".")[1][4:]) for p in self.dir.glob("server.rank*.exit.json"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); it is not serving. One reaped between the two looks
    # has no /proc entry any more: gone.
    if not Path("/proc/self/stat").is_file():  # no /proc here: kill(0) is all there is to go by
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _exit_record(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _info(files: RunFiles) -> dict:
    try:
        return json.loads(files.info.read_text())
    except (OSError, ValueError):
        return {}


def rank_states(files: RunFiles) -> dict[int, dict]:
    """rank -> {"pid", "alive", "exit"} for every rank a pid file or an exit record names since the
    last start; exit is the reaper's record ({"code", "signal", "at"}) once the rank ended without
    a stop, else None. Empty: nothing started, or stopped since."""
    pids = files.pids()
    states = {}
    for rank in sorted({*pids, *files.exits()}):
        record = _exit_record(files.rank_exit(rank))
        pid = pids.get(rank, (record or {}).get("pid", 0))
        # A record means it ended, whatever now holds its old pid.
        states[rank] = {"pid": pid, "alive": record is None and pid > 0 and _alive(pid), "exit": record}
    return states


def ended(state: dict) -> str:
    """How a rank that is not alive ended: `exit code -9 (SIGKILL) at 2025-01-02 03:04:05`."""
    record = state.get("exit")
    if not record:
        return f"pid {state['pid']} is gone (no exit status recorded)"
    sig = f" ({record['signal']})" if record.get("signal") else ""
    at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.get("at", 0)))
    return f"exit code {record.get('code')}{sig} at {at}"


def running(files: RunFiles) -> dict | None:
    """What was started, while any of its ranks is alive (`ranks`: rank -> pid, alive, exit)."""
    ranks = rank_states(files)
    if not any(r["alive"] for r in ranks.values()):
        return None
    return {**_info(files), "pid": ranks.get(0, {}).get("pid"), "ranks": ranks}


def crashed(files: RunFiles) -> dict | None:
    """What was started, when no rank is alive but it was never stopped (rank_states' ranks)."""
    ranks = rank_states(files)
    if not ranks or any(r["alive"] for r in ranks.values()):
        return None
    return {**_info(files), "pid": ranks.get(0, {}).get("pid"), "ranks": ranks}


def _clear(files: RunFiles) -> None:
    """Forget every rank's pid and exit record (the logs stay)."""
    for path in [files.pid, files.rank_exit(0), *files.dir.glob("server.rank*.pid"),
                 *files.dir.glob("server.rank*.exit.json"), *files.dir.glob("server*.tmp")]:
        path.unlink(missing_ok=True)


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
    env.update(procenv.ENGINE)
    return env


def rank_env(cfg: Config, rank: int, master_addr: str = "127.0.0.1") -> dict[str, str]:
    """What one tensor-parallel rank adds to the engine's environment (nothing with TP=1)."""
    if cfg.tp == 1:
        return {}
    return procenv.rank(rank, cfg.tp, master_addr, cfg.rdzv_port)


def log_tail(path: Path, lines: int = 20) -> str:
    if not path.is_file():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def first_streamed_token(url: str, model: str, timeout: float = 10.0, headers: dict | None = None) -> bool:
    """True once a streamed chat completion yields a first content token."""
    # No sampling fields: upstream's continuous batching fixes its sampling settings from
    # the first request it sees, and this probe must not choose them for the operator.
    body = {"model": model, "messages": [{"role": "user", "content": "ready?"}], "stream": True, "max_tokens": 1}
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout, headers=headers) as r:
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
        alive = [str(r["pid"]) for r in current["ranks"].values() if r["alive"]]
        raise LaunchError(f"already running (pid {', '.join(alive)} on {current.get('url')}); "
                          "run `scripts/serve.sh stop` first")


def _tails(files: RunFiles, ranks: int, lines: int = 20) -> str:
    if ranks == 1:
        return log_tail(files.log, lines)
    return "\n".join(f"--- rank {r} ({files.rank_log(r)}) ---\n{log_tail(files.rank_log(r), lines)}"
                     for r in range(ranks))


def start(cfg: Config, engine: Engine, model_path: str, files: RunFiles, progress=print) -> dict:
    refuse_if_running(files)
    if not port_free(cfg.host, cfg.port):
        raise LaunchError(f"port {cfg.port} on {cfg.host} is in use by another process; stop it or set "
                          f"PORT= in {cfg.source}")
    if cfg.tp > 1 and not port_free("127.0.0.1", cfg.rdzv_port):
        raise LaunchError(f"rendezvous port {cfg.rdzv_port} on 127.0.0.1 is in use by another process; stop it "
                          f"or set RDZV_PORT= in {cfg.source}")
    files.dir.mkdir(parents=True, exist_ok=True)
    _clear(files)
    for stale in files.dir.glob("server.rank*.log"):
        stale.unlink()
    procs = []  # each rank's reaper; it writes the engine's pid file and, at its end, the exit record
    for rank in range(cfg.tp):
        with files.rank_log(rank).open("w") as log:
            env = {**engine_env(engine, cfg.knobs), **rank_env(cfg, rank),
                   **(cfg.engine_http_env() if rank == 0 else {})}  # rank 0 serves HTTP
            cmd = [sys.executable, "-I", str(REAPER), str(files.rank_pid(rank)), str(files.rank_exit(rank)), "--",
                   *engine_command(cfg, model_path)]
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True, cwd=files.dir))
    info = {"url": cfg.url, "build_id": engine.build_id, "model": model_path,
            "served_as": cfg.served_names(model_path), "knobs": cfg.knobs_on(),
            "config": cfg.source, "started": int(time.time()), "tp": cfg.tp, "reapers": [p.pid for p in procs]}
    files.info.write_text(json.dumps(info, indent=2) + "\n")
    progress(f"waiting for the first streamed token from {cfg.url} (log: {files.log})")
    deadline = time.monotonic() + cfg.ready_timeout
    while time.monotonic() < deadline:
        exited = [(rank, p.returncode) for rank, p in enumerate(procs) if p.poll() is not None]
        if exited:
            rank, code = exited[0]
            record = _exit_record(files.rank_exit(rank)) or {}
            code = f"{record['code']} ({record['signal']})" if record.get("signal") else record.get("code", code)
            stop(files)
            what = "the engine" if cfg.tp == 1 else f"rank {rank}"
            also = "" if cfg.tp == 1 else "; every rank was stopped"
            raise LaunchError(f"{what} exited with code {code} before it was ready{also}; "
                              f"last log lines:\n{_tails(files, cfg.tp)}")
        if first_streamed_token(cfg.url, model_path, headers=cfg.auth_headers()):
            ranks = rank_states(files)
            return {**info, "pid": ranks[0]["pid"], "ranks": ranks}
        time.sleep(1.0)
    stop(files)
    stopped = "the engine was stopped" if cfg.tp == 1 else "every rank was stopped"
    raise LaunchError(f"no streamed token within {cfg.ready_timeout}s (READY_TIMEOUT); {stopped}; "
                      f"last log lines:\n{_tails(files, cfg.tp)}")


def stop(files: RunFiles, grace: float = 15.0) -> list[int]:
    """Stop every rank's whole process group, then forget the ranks (pid files and exit records, so
    this stop is not taken for a crash). Returns the pids stopped (rank order), [] if none ran."""
    current = running(files)
    if not current:
        _clear(files)
        return []
    pids = [r["pid"] for _, r in sorted(current["ranks"].items())]
    alive = [r["pid"] for r in current["ranks"].values() if r["alive"]]  # a dead rank's pid may be another's now
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in alive:
            try:
                os.killpg(pid, sig)
                os.killpg(pid, signal.SIGCONT)  # a stopped (SIGSTOP) rank acts on SIGTERM only once resumed
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(_alive(pid) for pid in alive):
            time.sleep(0.2)
        if not any(_alive(pid) for pid in alive):
            break
    # Each reaper writes its rank's exit record as the rank ends: wait for it, then remove it.
    reapers = current.get("reapers", [])
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(_alive(pid) for pid in reapers):
        time.sleep(0.05)
    _clear(files)
    return pids


def health(url: str, headers: dict | None = None) -> str:
    """`ok`, `unhealthy (HTTP 503: cb_worker_dead)` (the reason the engine gives), or
    `unreachable (ConnectError)`."""
    try:
        r = httpx.get(f"{url}/health", timeout=5, headers=headers)
    except httpx.HTTPError as e:
        return f"unreachable ({type(e).__name__})"
    if r.status_code == 200:
        return "ok"
    try:
        body = r.json()
        why = ": ".join(str(body[k]) for k in ("reason", "error") if body.get(k)) if isinstance(body, dict) else ""
    except ValueError:
        why = ""
    return f"unhealthy (HTTP {r.status_code}: {(why or r.text)[:120]})"


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

"""RUNTIME=local: the engine's processes on this machine (launch does the work), as a Runtime,
with its watchdog (`watch`)."""

from __future__ import annotations

import sys
import time

from .. import ROOT
from ..series import build
from ..series.knobs import validate_settings
from ..series.series import Series, load_usable
from ..verb import Fail, print_rows
from . import launch
from . import watch as watchdog
from .config import Config, load
from .models import model_path


def build_wheel(series: Series | None) -> int:
    """The engine wheel of series (None: pristine upstream); skipped when it exists."""
    engine = build.build(series)
    print(f"{engine.build_id}: wheel {engine.wheel.relative_to(ROOT)}, engine {engine.site.relative_to(ROOT)}")
    return 0


class Local:
    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.files = launch.RunFiles(cfg.run_path)

    def build(self) -> int:
        return build_wheel(load_usable())

    def start(self) -> int:
        print(self._serve(print))
        return 0

    def _serve(self, progress) -> str:
        """Build what is missing and start; the line that says what serves."""
        cfg = self.cfg
        series = load_usable()
        errors = validate_settings(series.knobs(), cfg.knobs, cfg.source)
        if errors:
            raise Fail("\n".join(errors), 2)
        launch.refuse_if_running(self.files)  # before the build, so a second start fails at once
        t0 = time.monotonic()
        engine = build.build(series, progress=progress)
        path = model_path(cfg)
        info = launch.start(cfg, engine, path, self.files, progress=progress)
        on = ", ".join(f"{k}={v}" for k, v in info["knobs"].items()) or "none"
        return (f"serving {path} on {info['url']} (build {info['build_id']}, knobs on: {on}, pid {info['pid']}, "
                f"ready in {time.monotonic() - t0:.0f}s)")

    def stop(self) -> int:
        crash = _crash(launch.crashed(self.files))
        pids = launch.stop(self.files)
        if crash:
            print(f"not running (it had crashed: {crash}; that record is cleared)")
        elif not pids:
            print("not running")
        elif len(pids) == 1:
            print(f"stopped pid {pids[0]}")
        else:
            print(f"stopped pids {', '.join(map(str, pids))} (ranks 0-{len(pids) - 1})")
        return 0

    def status(self) -> int:
        crashed = launch.crashed(self.files)
        if crashed:
            print(f"crashed: {_crash(crashed)}; last log lines:")
            print(self._tails(crashed["ranks"], crashed.get("tp", 1)))
            print("fix: read `scripts/serve.sh logs -n 200`, then `scripts/serve.sh start` (or let `watch` do it)")
            return 1
        info = launch.running(self.files)
        if not info:
            print("not running")
            return 3
        ranks = info["ranks"]
        if len(ranks) == 1:
            pid_rows = [("pid", info["pid"])]
        else:
            pid_rows = [(f"rank {r}", f"pid {v['pid']} " + ("alive" if v["alive"] else f"DEAD: {launch.ended(v)}")
                         + (" (HTTP)" if r == 0 else "")) for r, v in sorted(ranks.items())]
        health = launch.health(info.get("url", ""), headers=self.cfg.auth_headers())
        print_rows([("url", info.get("url")), *pid_rows, ("build", info.get("build_id")),
                    ("model", info.get("model")), ("model id", info.get("served_as", info.get("model"))),
                    ("config", info.get("config")),
                    ("knobs on", ", ".join(f"{k}={v}" for k, v in info.get("knobs", {}).items()) or "none"),
                    ("up", f"{int(time.time()) - info.get('started', int(time.time()))}s"),
                    ("health", health)])
        dead = {r: v for r, v in ranks.items() if not v["alive"]}
        if dead:
            print(f"\nlast log lines of the dead rank(s):\n{self._tails(dead, len(ranks))}")
        return 0 if health == "ok" and not dead else 1

    def _tails(self, ranks: dict, tp: int, lines: int = 10) -> str:
        if tp == 1:
            return launch.log_tail(self.files.log, lines)
        return "\n".join(f"--- rank {r} ({self.files.rank_log(r)}) ---\n{launch.log_tail(self.files.rank_log(r), lines)}"
                         for r in sorted(ranks))

    def watch(self, interval: float, once: bool, unhealthy: int = 3) -> int:
        """Start the server when none runs, restart it when a rank died or `unhealthy` health checks
        in a row failed; the config file is read again for each restart."""

        def check() -> tuple[str, str]:
            info = launch.running(self.files)
            if not info:
                crash = _crash(launch.crashed(self.files))
                return (f"crashed: {crash}" if crash else "not running"), ""
            dead = [f"rank {r} {launch.ended(v)}" for r, v in sorted(info["ranks"].items()) if not v["alive"]]
            return "; ".join(dead), launch.health(info.get("url", self.cfg.url), headers=self.cfg.auth_headers())

        def restart() -> str:
            cfg = load(self.cfg.source_path)
            launch.stop(self.files)
            self.cfg, self.files = cfg, launch.RunFiles(cfg.run_path)
            return self._serve(lambda *_: None)

        return watchdog.loop(check, restart, "the server", interval, unhealthy, once)

    def logs(self, rank: int, lines: int, follow: bool) -> int:
        log = self.files.rank_log(rank)
        if not log.is_file():
            raise Fail("no log yet; start the server first" if rank == 0 else f"no log of rank {rank}")
        print(launch.log_tail(log, lines))
        if follow:
            with log.open() as f:
                f.seek(0, 2)
                while True:
                    line = f.readline()
                    if line:
                        sys.stdout.write(line)
                        sys.stdout.flush()
                    else:
                        time.sleep(0.5)
        return 0


def _crash(crashed: dict | None) -> str:
    """How a server ended without a stop (launch.crashed's answer); '' for None."""
    if not crashed:
        return ""
    ranks = crashed["ranks"]
    if crashed.get("tp", 1) == 1 and len(ranks) == 1:
        return launch.ended(next(iter(ranks.values())))
    return "; ".join(f"rank {r} {launch.ended(v)}" for r, v in sorted(ranks.items()))

"""RUNTIME=local: the engine's processes on this machine (launch does the work), as a Runtime."""

from __future__ import annotations

import sys
import time

from .. import ROOT
from ..series import build
from ..series.knobs import validate_settings
from ..series.series import Series, load_usable
from ..verb import Fail, print_rows
from . import launch
from .config import Config
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
        cfg = self.cfg
        series = load_usable()
        errors = validate_settings(series.knobs(), cfg.knobs, cfg.source)
        if errors:
            raise Fail("\n".join(errors), 2)
        launch.refuse_if_running(self.files)  # before the build, so a second start fails at once
        t0 = time.monotonic()
        engine = build.build(series)
        path = model_path(cfg)
        info = launch.start(cfg, engine, path, self.files)
        on = ", ".join(f"{k}={v}" for k, v in info["knobs"].items()) or "none"
        print(f"serving {path} on {info['url']} (build {info['build_id']}, knobs on: {on}, pid {info['pid']}, "
              f"ready in {time.monotonic() - t0:.0f}s)")
        return 0

    def stop(self) -> int:
        pids = launch.stop(self.files)
        if not pids:
            print("not running")
        elif len(pids) == 1:
            print(f"stopped pid {pids[0]}")
        else:
            print(f"stopped pids {', '.join(map(str, pids))} (ranks 0-{len(pids) - 1})")
        return 0

    def status(self) -> int:
        info = launch.running(self.files)
        if not info:
            print("not running")
            return 3
        ranks = info["ranks"]
        if len(ranks) == 1:
            pid_rows = [("pid", info["pid"])]
        else:
            pid_rows = [(f"rank {r}", f"pid {v['pid']} {'alive' if v['alive'] else 'DEAD'}"
                         + (" (HTTP)" if r == 0 else "")) for r, v in sorted(ranks.items())]
        print_rows([("url", info.get("url")), *pid_rows, ("build", info.get("build_id")),
                    ("model", info.get("model")), ("config", info.get("config")),
                    ("knobs on", ", ".join(f"{k}={v}" for k, v in info.get("knobs", {}).items()) or "none"),
                    ("up", f"{int(time.time()) - info.get('started', int(time.time()))}s"),
                    ("health", launch.health(info.get("url", "")))])
        return 0

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

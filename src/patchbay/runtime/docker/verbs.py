"""RUNTIME=docker as a Runtime (build, start, stop, status, logs), plus its own verbs (preflight,
watch, base-image): the thin layer over the image / nodes / preflight / pair modules."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ...series.series import Series, load_usable
from ...series.upstream import LOCK_PATH
from ...verb import Fail, print_rows
from ..config import Config
from ..models import model_path
from .nodes import nodes


def _build_id(series: Series) -> str:
    return "pb-" + series.build_id(LOCK_PATH)


def base_image(mirror: str | None) -> int:
    from . import image
    from .nodes import Node

    client = Node("head", 0, "local", "127.0.0.1").client()
    t0 = time.monotonic()
    tag = image.ensure_base(client, mirror=mirror)
    print(f"base image {tag} ({time.monotonic() - t0:.0f}s)")
    return 0


def _config_text(cfg: Config) -> str:
    try:
        return cfg.source_path.read_text()[:8000]
    except OSError:
        return ""


class Docker:
    def __init__(self, cfg: Config):
        self.cfg = cfg

    def model(self) -> str:
        """The checkpoint path on every node (the synthetic model is written here first); whether
        it exists on each node is preflight's to say."""
        if self.cfg.model.startswith("synthetic:"):
            return model_path(self.cfg)
        return str(Path(self.cfg.model).resolve())

    def _need_docker(self) -> None:
        if self.cfg.runtime != "docker":
            raise Fail(f"{self.cfg.source}: RUNTIME={self.cfg.runtime}; this verb is for RUNTIME=docker", 2)

    def build(self) -> int:
        """Build the serving image on the head (skipped when it exists), then copy it to the worker."""
        from . import image

        cfg, series = self.cfg, load_usable()
        ns = nodes(cfg)
        head = ns[0].client()
        t0 = time.monotonic()
        extra_ca = Path(cfg.extra_ca_bundle).expanduser() if cfg.extra_ca_bundle else None
        tag, built = image.build_image(head, series, base_image=cfg.base_image, extra_ca=extra_ca)
        build_id = _build_id(series)
        print(f"{build_id}: image {tag} " + (f"built in {time.monotonic() - t0:.0f}s" if built else "already built"))
        for node in ns[1:]:
            if node.same_engine_as(ns[0]):
                print(f"{node.role}: same Docker engine as the head ({node.endpoint}); nothing to copy")
                continue
            t1 = time.monotonic()
            copied = image.copy_image(head, node.client(), tag, build_id)
            print(f"{node.role}: " + (f"{tag} copied and verified ({time.monotonic() - t1:.0f}s)" if copied
                                      else f"{tag} already there (build label {build_id})"))
        return 0

    def preflight(self) -> int:
        from . import preflight as pf

        self._need_docker()
        rows = pf.preflight(self.cfg, _build_id(load_usable()), self.model())
        print(pf.render(rows))
        failed = sum(not r.ok for r in rows)
        print(f"\npreflight: {failed} FAIL" if failed else "\npreflight: all PASS")
        return 1 if failed else 0

    def start(self) -> int:
        from . import pair
        from . import preflight as pf

        cfg = self.cfg
        series = load_usable()
        model = self.model()
        t0 = time.monotonic()
        build_id = _build_id(series)
        current = pair.status(cfg)
        if current[0] != 3 and any(row[3] == "running" for row in current[2]):
            raise Fail(f"already running ({', '.join(r[2] for r in current[2] if r[3] == 'running')}); "
                       "run `scripts/serve.sh stop` first")
        pair.stop(cfg)  # leftovers of a pair that died, so preflight sees free ports
        rows = pf.preflight(cfg, build_id, model)
        fails = [r for r in rows if not r.ok]
        if fails:
            print(pf.render(rows), file=sys.stderr)
            first = fails[0]
            raise Fail(f"preflight failed: {first.node} {first.check}: {first.detail}; fix: {first.fix}")
        info = pair.start(cfg, build_id, model, _config_text(cfg), ifnames=pf.detected_ifnames(rows))
        on = ", ".join(f"{k}={v}" for k, v in info["knobs"].items()) or "none"
        print(f"serving {model} on {info['url']} ({cfg.world_size} rank(s), build {build_id}, knobs on: {on}, "
              f"ready in {time.monotonic() - t0:.0f}s)")
        return 0

    def stop(self) -> int:
        from . import pair

        removed = pair.stop(self.cfg)
        print("removed " + ", ".join(removed) if removed else "not running")
        return 0

    def status(self) -> int:
        from . import pair

        code, summary, rows = pair.status(self.cfg)
        if code == 3:
            print("not running")
            return 3
        print_rows(summary)
        print()
        table = [["rank", "node", "container", "state", "build"]] + rows
        widths = [max(len(r[i]) for r in table) for i in range(5)]
        for r in table:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        return code

    def logs(self, rank: int, lines: int, follow: bool) -> int:
        from . import pair

        pair.logs(self.cfg, rank, lines, follow, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
        return 0

    def watch(self, interval: float, once: bool, unhealthy: int = 3) -> int:
        """Start the pair when none runs, restart it when a rank died or the head failed `unhealthy`
        health checks in a row (runtime.watch's loop). The config file is read again for each
        restart; the weights manifests live in their own Docker volume."""
        from .. import config as config_mod
        from .. import watch as watchdog
        from . import pair

        self._need_docker()

        def check() -> tuple[str, str]:
            code, summary, rows = pair.status(self.cfg)
            if code == 3:
                return "no pair", ""
            down = ", ".join(f"rank {r[0]} {r[3]}" for r in rows if r[3] != "running")
            return down, dict(summary).get("health", "")

        def restart() -> str:
            self.cfg = config_mod.load(self.cfg.source_path)
            pair.stop(self.cfg)
            self.start()  # prints what serves
            return "the pair was restarted"

        return watchdog.loop(check, restart, "the pair", interval, unhealthy, once)

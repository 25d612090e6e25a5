"""The verbs of RUNTIME=docker (build, base-image, preflight, start, stop, status, logs, watch):
the thin layer between cli.py and the image / nodes / preflight / pair modules."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from . import ROOT
from .cli import Fail
from .config import Config
from .nodes import nodes
from .upstream import LOCK_PATH


def _build_id(series) -> str:
    return "pb-" + series.build_id(LOCK_PATH)


def base_image(args) -> int:
    from . import image
    from .nodes import Node

    client = Node("head", 0, "local", "127.0.0.1").client()
    t0 = time.monotonic()
    tag = image.ensure_base(client, mirror=args.mirror)
    print(f"base image {tag} ({time.monotonic() - t0:.0f}s)")
    return 0


def build(cfg: Config, series, args) -> int:
    """Build the serving image on the head (skipped when it exists), then copy it to the worker."""
    from . import image

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


def _model(cfg: Config) -> str:
    """The checkpoint path on every node (the synthetic model is written here first); whether it
    exists on each node is preflight's to say."""
    from .cli import model_path

    if cfg.model == "synthetic:tiny":
        return model_path(cfg)
    return str(Path(cfg.model).resolve())


def preflight(cfg: Config) -> int:
    from . import preflight as pf

    from .cli import _series

    _need_docker(cfg)
    rows = pf.preflight(cfg, _build_id(_series()), _model(cfg))
    print(pf.render(rows))
    failed = sum(not r.ok for r in rows)
    print(f"\npreflight: {failed} FAIL" if failed else "\npreflight: all PASS")
    return 1 if failed else 0


def _need_docker(cfg: Config) -> None:
    if cfg.runtime != "docker":
        raise Fail(f"{cfg.source}: RUNTIME={cfg.runtime}; this verb is for RUNTIME=docker", 2)


def start(cfg: Config, series, model_path: str) -> int:
    from . import pair
    from . import preflight as pf

    t0 = time.monotonic()
    build_id = _build_id(series)
    current = pair.status(cfg)
    if current[0] != 3 and any(row[3] == "running" for row in current[2]):
        raise Fail(f"already running ({', '.join(r[2] for r in current[2] if r[3] == 'running')}); "
                   "run `scripts/serve.sh stop` first")
    pair.stop(cfg)  # leftovers of a pair that died, so preflight sees free ports
    rows = pf.preflight(cfg, build_id, model_path)
    fails = [r for r in rows if not r.ok]
    if fails:
        print(pf.render(rows), file=sys.stderr)
        first = fails[0]
        raise Fail(f"preflight failed: {first.node} {first.check}: {first.detail}; fix: {first.fix}")
    config_text = _config_text(cfg)
    info = pair.start(cfg, build_id, model_path, config_text, ifnames=pf.detected_ifnames(rows))
    on = ", ".join(f"{k}={v}" for k, v in info["knobs"].items()) or "none"
    print(f"serving {model_path} on {info['url']} ({cfg.world_size} rank(s), build {build_id}, knobs on: {on}, "
          f"ready in {time.monotonic() - t0:.0f}s)")
    return 0


def _config_text(cfg: Config) -> str:
    path = ROOT / cfg.source if not Path(cfg.source).is_absolute() else Path(cfg.source)
    try:
        return path.read_text()[:8000]
    except OSError:
        return ""


def stop(cfg: Config) -> int:
    from . import pair

    removed = pair.stop(cfg)
    print("removed " + ", ".join(removed) if removed else "not running")
    return 0


def status(cfg: Config) -> int:
    from . import pair

    code, summary, rows = pair.status(cfg)
    if code == 3:
        print("not running")
        return 3
    width = max(len(k) for k, _ in summary)
    for key, value in summary:
        print(f"{key:<{width}}  {value}")
    print()
    table = [["rank", "node", "container", "state", "build"]] + rows
    widths = [max(len(r[i]) for r in table) for i in range(5)]
    for r in table:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return code


def logs(cfg: Config, rank: int, lines: int, follow: bool) -> int:
    from . import pair

    pair.logs(cfg, rank, lines, follow, lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    return 0


def watch(cfg: Config, args) -> int:
    """Restart the pair when a rank died or the head failed three health checks in a row. The config
    file is read again for each restart; the weights manifests live in their own Docker volume."""
    from . import config as config_mod
    from . import pair
    from .launch import LaunchError

    _need_docker(cfg)
    source = ROOT / cfg.source if not Path(cfg.source).is_absolute() else Path(cfg.source)
    bad = 0
    while True:
        code, summary, rows = pair.status(cfg)
        health = dict(summary).get("health", "")
        dead = code == 3 or any(r[3] != "running" for r in rows)
        bad = bad + 1 if (dead or health != "ok") else 0
        if dead or bad >= 3:
            why = "no pair" if code == 3 else ", ".join(f"rank {r[0]} {r[3]}" for r in rows if r[3] != "running") \
                or f"head health: {health}"
            print(f"{time.strftime('%H:%M:%S')} watch: restarting the pair ({why})", flush=True)
            try:
                cfg = config_mod.load(source)
                from .cli import _series

                pair.stop(cfg)
                start(cfg, _series(), _model(cfg))
                bad = 0
            except (Fail, LaunchError, config_mod.ConfigError) as e:
                print(f"{time.strftime('%H:%M:%S')} watch: restart failed: {e}", flush=True)
        if args.once:
            return 0 if bad == 0 else 1
        time.sleep(args.interval)

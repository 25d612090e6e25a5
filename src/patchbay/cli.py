"""`python -m patchbay VERB`: a thin layer over the modules; each verb is one job.

Exit codes: 0 done, 1 a check failed or the operation failed, 2 bad input (config,
arguments), 3 `status` with nothing running.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from . import ROOT

DOCS_PATCHES = ROOT / "docs" / "PATCHES.md"


class Fail(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def _series(strict: bool = True):
    from . import series

    loaded, problems = series.load()
    if problems and strict:
        raise Fail("\n".join(str(p) for p in problems) + "\nrun `patchbay check` for the full report")
    return loaded


def _lock():
    from .upstream import Lock

    return Lock.read()


def cmd_upstream(args) -> int:
    from . import upstream

    path = upstream.ensure(_lock())
    print(f"{path}: pristine {_lock().name} {_lock().version}, matches upstream.lock")
    return 0


def cmd_check(args) -> int:
    from . import series, upstream

    lock = _lock()
    checked, problems = series.check(series.SERIES_DIR, upstream.ensure(lock), lock.ref_tag, lock.src_path)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) in the series")
        return 1
    print(f"series ok: {len(checked.patches)} patches apply to {lock.name} {lock.version} with zero fuzz, "
          f"{len(checked.overlay_files())} overlay files each named by a patch; "
          f"build id pb-{checked.build_id(ROOT / 'upstream.lock')}")
    return 0


def cmd_build(args) -> int:
    from . import build

    if not (args.pristine or args.wheel) and (args.image or _config(args).runtime == "docker"):
        from . import docker_cli

        return docker_cli.build(_config(args), _series(), args)
    engine = build.build(None if args.pristine else _series())
    print(f"{engine.build_id}: wheel {engine.wheel.relative_to(ROOT)}, engine {engine.site.relative_to(ROOT)}")
    return 0


def generated(path: Path, text: str, check: bool, regenerate: str, detail: str = "") -> int:
    """Write a generated file, or with check only say whether it is stale (exit 1 if so)."""
    shown = path.resolve().relative_to(ROOT) if ROOT in path.resolve().parents else path
    if check:
        if not path.is_file() or path.read_text() != text:
            print(f"{shown} is stale; run `{regenerate}`")
            return 1
        print(f"{shown} is up to date{detail}")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {shown}{detail}")
    return 0


def cmd_docs(args) -> int:
    from .knobs import render_patches_md

    return generated(DOCS_PATCHES, render_patches_md(_series()), args.check, "python -m patchbay docs")


def cmd_rebase(args) -> int:
    from . import rebase, upstream

    lock = _lock()
    outcomes, sha = rebase.rebase(_series(), lock, upstream.ensure(lock), args.to,
                                  sdist=Path(args.sdist) if args.sdist else None)
    text = rebase.report(lock, args.to, sha, outcomes)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {out}")
    else:
        print(text, end="")
    return 0


def cmd_synth(args) -> int:
    from . import synth

    try:
        if args.kind == "tiny":
            path = synth.write_tiny(Path(args.dir), seed=args.seed)
        else:
            import torch

            if args.device.startswith("cuda") and not torch.cuda.is_available():
                raise Fail(f"synth {args.kind}: --device {args.device}, but this machine has no CUDA device "
                           "(the model is built on a GPU; --device cpu needs its whole size in memory)", 2)
            path = synth.write_air(Path(args.dir), args.kind, seed=args.seed, device=args.device)
    except ValueError as e:
        raise Fail(str(e), 2) from None
    print(f"wrote synthetic:{args.kind} (seed {args.seed}) to {path}")
    return 0


def cmd_dev(args) -> int:
    from . import devtree, upstream

    lock = _lock()
    path = devtree.create(_series(), upstream.ensure(lock), lock.ref_tag, force=args.force, src_path=lock.src_path)
    print(f"{path}: the overlay, then one commit per patch on {lock.ref_tag}; edit there (or in engine/), "
          "then `patchbay export`")
    return 0


def cmd_export(args) -> int:
    from . import devtree

    lock = _lock()
    changed = devtree.export(_series(strict=False), lock.ref_tag, src_path=lock.src_path)
    print("rewrote " + (", ".join(changed) if changed else "nothing (patches and engine/ already match build/dev)"))
    return 0


# ---- serving ------------------------------------------------------------------------------


def _config(args):
    from . import config

    try:
        return config.load(Path(args.config) if args.config else None)
    except config.ConfigError as e:
        raise Fail(str(e), 2) from None


def model_path(cfg) -> str:
    if cfg.model == "synthetic:tiny":
        from . import synth

        return str(synth.write_tiny(ROOT / ".cache" / "models" / f"tiny-s{cfg.synth_seed}", seed=cfg.synth_seed))
    path = Path(cfg.model).resolve()
    if not (path / "config.json").is_file():
        raise Fail(f"{cfg.source}: MODEL={cfg.model}: no config.json in {path}; give a local checkpoint folder", 2)
    return str(path)


def cmd_start(args) -> int:
    from . import build, launch
    from .knobs import validate_settings

    cfg = _config(args)
    if cfg.runtime == "docker":
        from . import docker_cli

        return docker_cli.start(cfg, _series(), docker_cli._model(cfg))
    series = _series()
    errors = validate_settings(series.knobs(), cfg.knobs, cfg.source)
    if errors:
        raise Fail("\n".join(errors), 2)
    files = launch.RunFiles(cfg.run_path)
    launch.refuse_if_running(files)  # before the build, so a second start fails at once
    t0 = time.monotonic()
    engine = build.build(series)
    path = model_path(cfg)
    info = launch.start(cfg, engine, path, files)
    on = ", ".join(f"{k}={v}" for k, v in info["knobs"].items()) or "none"
    print(f"serving {path} on {info['url']} (build {info['build_id']}, knobs on: {on}, pid {info['pid']}, "
          f"ready in {time.monotonic() - t0:.0f}s)")
    return 0


def cmd_stop(args) -> int:
    from . import launch

    if _config(args).runtime == "docker":
        from . import docker_cli

        return docker_cli.stop(_config(args))
    pids = launch.stop(launch.RunFiles(_config(args).run_path))
    if not pids:
        print("not running")
    elif len(pids) == 1:
        print(f"stopped pid {pids[0]}")
    else:
        print(f"stopped pids {', '.join(map(str, pids))} (ranks 0-{len(pids) - 1})")
    return 0


def cmd_status(args) -> int:
    from . import launch

    if _config(args).runtime == "docker":
        from . import docker_cli

        return docker_cli.status(_config(args))
    info = launch.running(launch.RunFiles(_config(args).run_path))
    if not info:
        print("not running")
        return 3
    ranks = info["ranks"]
    if len(ranks) == 1:
        pid_rows = [("pid", info["pid"])]
    else:
        pid_rows = [(f"rank {r}", f"pid {v['pid']} {'alive' if v['alive'] else 'DEAD'}"
                     + (" (HTTP)" if r == 0 else "")) for r, v in sorted(ranks.items())]
    rows = [("url", info.get("url")), *pid_rows, ("build", info.get("build_id")),
            ("model", info.get("model")), ("config", info.get("config")),
            ("knobs on", ", ".join(f"{k}={v}" for k, v in info.get("knobs", {}).items()) or "none"),
            ("up", f"{int(time.time()) - info.get('started', int(time.time()))}s"),
            ("health", launch.health(info.get("url", "")))]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def cmd_logs(args) -> int:
    from . import launch

    if _config(args).runtime == "docker":
        from . import docker_cli

        return docker_cli.logs(_config(args), args.rank, args.lines, args.follow)
    files = launch.RunFiles(_config(args).run_path)
    log = files.rank_log(args.rank)
    if not log.is_file():
        raise Fail("no log yet; start the server first" if args.rank == 0 else f"no log of rank {args.rank}")
    print(launch.log_tail(log, args.lines))
    if args.follow:
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


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="patchbay", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def verb(name, fn, help):
        s = sub.add_parser(name, help=help, description=help)
        s.set_defaults(fn=fn)
        return s

    verb("upstream", cmd_upstream, "materialize and verify the pristine source in upstream/")
    verb("check", cmd_check, "validate the series: headers, knobs, order, zero-fuzz apply")
    b = verb("build", cmd_build, "apply the series and build the engine wheel (skipped when unchanged)")
    b.add_argument("--wheel", action="store_true", help="build the wheel and its engine folder (the default with RUNTIME=local)")
    b.add_argument("--pristine", action="store_true", help="build upstream with no patches")
    b.add_argument("--image", action="store_true",
                   help="build the serving image (the default with RUNTIME=docker) and copy it to the worker")
    b.add_argument("--config", help="config file (RUNTIME=docker builds the image; default: config/local.env, "
                                    "else config/local.env.example)")
    bi = verb("base-image", lambda a: __import__("patchbay.docker_cli").docker_cli.base_image(a),
              "build the offline base image (debootstrap, the host's apt mirror, the host's torch wheel)")
    bi.add_argument("--mirror", help="Debian mirror URL (default: the host's own, from /etc/apt)")
    d = verb("docs", cmd_docs, "regenerate docs/PATCHES.md from the patch headers")
    d.add_argument("--check", action="store_true", help="only report whether it is stale")
    r = verb("rebase", cmd_rebase, "report how the series applies to another upstream release")
    r.add_argument("--to", required=True, metavar="VERSION")
    r.add_argument("--sdist", help="use this sdist instead of downloading VERSION's")
    r.add_argument("--out", help="write the Markdown report here (default: print it)")
    s = verb("synth", cmd_synth, "write a seeded synthetic checkpoint")
    s.add_argument("kind", choices=["tiny", "air12", "air24"])
    s.add_argument("dir")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--device", default="cuda", help="where air12/air24 are built before saving (default: cuda)")
    dv = verb("dev", cmd_dev, "check out the series as one commit per patch in build/dev")
    dv.add_argument("--force", action="store_true", help="recreate build/dev (it must be clean)")
    verb("export", cmd_export, "rewrite the patches from build/dev's commits, keeping headers")
    from . import measure_cli  # exact, score, ab, results

    measure_cli.add_verbs(verb)
    for name, fn, help in (("start", cmd_start, "build what is missing and start serving; ready = a streamed token"),
                           ("stop", cmd_stop, "stop the server"),
                           ("status", cmd_status, "what is running: ranks, build, knobs, model, pid, health"),
                           ("logs", cmd_logs, "show the server log of rank RANK (default 0)"),
                           ("preflight", lambda a: __import__("patchbay.docker_cli").docker_cli.preflight(_config(a)),
                            "RUNTIME=docker: check both nodes before a start (PASS/FAIL, each FAIL with its fix)"),
                           ("watch", lambda a: __import__("patchbay.docker_cli").docker_cli.watch(_config(a), a),
                            "RUNTIME=docker: restart the pair whenever a rank dies or the head stops answering")):
        v = verb(name, fn, help)
        v.add_argument("--config", help="config file (default: config/local.env, else config/local.env.example)")
        if name == "logs":
            v.add_argument("rank", nargs="?", type=int, default=0, help="tensor-parallel rank (default: 0)")
            v.add_argument("-n", "--lines", type=int, default=50)
            v.add_argument("-f", "--follow", action="store_true")
        if name == "watch":
            v.add_argument("--interval", type=float, default=5.0, help="seconds between checks (default 5)")
            v.add_argument("--once", action="store_true", help="check once, restart if needed, then exit")
    return p


def main(argv: list[str] | None = None) -> int:
    from .build import BuildError
    from .devtree import SeriesError
    from .gitutil import GitError
    from .image import ImageError
    from .launch import LaunchError
    from .nodes import NodeError
    from .upstream import UpstreamError

    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except Fail as e:
        print(f"patchbay {args.verb}: {e}", file=sys.stderr)
        return e.code
    except (UpstreamError, SeriesError, BuildError, LaunchError, GitError, ImageError, NodeError) as e:
        print(f"patchbay {args.verb}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

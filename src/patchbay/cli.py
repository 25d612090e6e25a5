"""`python -m patchbay VERB`: a thin layer over the modules; each verb is one job.

The operator's one entry point over the layers (series, runtime, measure); nothing imports it.
The GPU machine's is `python -m patchbay.device`.

Exit codes: 0 done, 1 a check failed or the operation failed, 2 bad input (config,
arguments), 3 `status` with nothing running.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from . import ROOT
from .verb import Fail, generated, guarded

DOCS_PATCHES = ROOT / "docs" / "PATCHES.md"


def _series(strict: bool = True):
    from .series import series

    if strict:
        return series.load_usable()
    return series.load()[0]


def _lock():
    from .series.upstream import Lock

    return Lock.read()


def _default_context() -> int:
    from .runtime.config import Config

    return Config.synth_context


def _config(args):
    from .runtime import config

    try:
        return config.load(Path(args.config) if args.config else None)
    except config.ConfigError as e:
        raise Fail(str(e), 2) from None


def _runtime(args, kind: str | None = None):
    from .runtime.serving import runtime_for

    return runtime_for(_config(args), kind)


def _docker(args):
    from .runtime.docker.verbs import Docker

    return Docker(_config(args))


def cmd_upstream(args) -> int:
    from .series import upstream

    path = upstream.ensure(_lock())
    print(f"{path}: pristine {_lock().name} {_lock().version}, matches upstream.lock")
    return 0


def cmd_check(args) -> int:
    from .series import series, upstream

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
    if args.pristine or args.wheel:  # no config read: the image's own build runs `build --wheel`
        from .runtime.local import build_wheel

        return build_wheel(None if args.pristine else _series())
    return _runtime(args, "docker" if args.image else None).build()


def cmd_docs(args) -> int:
    from .runtime.config import knob_set
    from .series.knobs import render_knob_set_md, render_patches_md, with_block

    loaded = _series()
    readme = ROOT / "README.md"
    prod = with_block(readme.read_text(), "prod", render_knob_set_md("prod", knob_set("prod"), loaded))
    return (generated(DOCS_PATCHES, render_patches_md(loaded), args.check, "python -m patchbay docs")
            | generated(readme, prod, args.check, "python -m patchbay docs"))


def cmd_rebase(args) -> int:
    from .series import rebase, upstream

    if args.check and not args.out:
        raise Fail("rebase --check needs --out: the report to compare with", code=2)
    lock = _lock()
    outcomes, sha = rebase.rebase(_series(), lock, upstream.ensure(lock), args.to,
                                  sdist=Path(args.sdist) if args.sdist else None)
    text = rebase.report(lock, args.to, sha, outcomes)
    if args.out:
        return generated(Path(args.out), text, args.check, f"python -m patchbay rebase --to {args.to} --out {args.out}")
    print(text, end="")
    return 0


def cmd_synth(args) -> int:
    from .runtime import config, synth, trained

    try:
        if args.dtype and args.kind != "trained":
            raise Fail(f"synth {args.kind}: --dtype is for trained (tiny is float32, air12/air24 bfloat16)", 2)
        if args.kind in ("tiny", "trained"):
            try:  # the one check of a context, the config's
                config.Config(synth_context=args.context, source="synth --context")
            except config.ConfigError as e:
                raise Fail(str(e), 2) from None
            if args.kind == "tiny":
                path = synth.write_tiny(Path(args.dir), seed=args.seed, context=args.context)
            else:
                path = trained.write_trained(Path(args.dir), seed=args.seed, context=args.context,
                                             log=lambda line: print(f"training: {line}", flush=True),
                                             dtype=args.dtype or "float32")
        else:
            import torch

            if args.device.startswith("cuda") and not torch.cuda.is_available():
                raise Fail(f"synth {args.kind}: --device {args.device}, but this machine has no CUDA device "
                           "(the model is built on a GPU; --device cpu needs its whole size in memory)", 2)
            path = synth.write_air(Path(args.dir), args.kind, seed=args.seed, device=args.device)
    except ValueError as e:
        raise Fail(str(e), 2) from None
    context = f", context {args.context}" if args.kind in ("tiny", "trained") else ""
    print(f"wrote synthetic:{args.kind} (seed {args.seed}{context}) to {path}")
    return 0


def cmd_dev(args) -> int:
    from .series import devtree, upstream

    lock = _lock()
    path = devtree.create(_series(), upstream.ensure(lock), lock.ref_tag, force=args.force, src_path=lock.src_path)
    print(f"{path}: the overlay, then one commit per patch on {lock.ref_tag}; edit there (or in engine/), "
          "then `patchbay export`")
    return 0


def cmd_export(args) -> int:
    from .series import devtree

    lock = _lock()
    changed = devtree.export(_series(strict=False), lock.ref_tag, src_path=lock.src_path)
    print("rewrote " + (", ".join(changed) if changed else "nothing (patches and engine/ already match build/dev)"))
    return 0


# ---- serving: the config's runtime does each verb -----------------------------------------


def cmd_start(args) -> int:
    return _runtime(args).start()


def cmd_stop(args) -> int:
    return _runtime(args).stop()


def cmd_status(args) -> int:
    return _runtime(args).status()


def cmd_logs(args) -> int:
    return _runtime(args).logs(args.rank, args.lines, args.follow)


def cmd_preflight(args) -> int:
    return _docker(args).preflight()


def cmd_watch(args) -> int:
    if args.unhealthy < 1 or args.interval < 0:
        raise Fail("--unhealthy must be 1 or more and --interval 0 or more", 2)
    return _runtime(args).watch(args.interval, args.once, args.unhealthy)


def cmd_base_image(args) -> int:
    from .runtime.docker.verbs import base_image

    return base_image(args.mirror)


def parser() -> argparse.ArgumentParser:
    from .measure import verbs as measure_verbs  # exact, score, ab, results

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
    bi = verb("base-image", cmd_base_image,
              "build the offline base image (debootstrap, the host's apt mirror, the host's torch wheel)")
    bi.add_argument("--mirror", help="Debian mirror URL (default: the host's own, from /etc/apt)")
    d = verb("docs", cmd_docs, "regenerate docs/PATCHES.md from the patch headers and README's production "
                              "knob table from config/knob-sets.toml")
    d.add_argument("--check", action="store_true", help="only report whether it is stale")
    r = verb("rebase", cmd_rebase, "report how the series applies to another upstream release")
    r.add_argument("--to", required=True, metavar="VERSION")
    r.add_argument("--sdist", help="use this sdist instead of downloading VERSION's")
    r.add_argument("--out", help="write the Markdown report here (default: print it)")
    r.add_argument("--check", action="store_true", help="with --out: only report whether that report is stale")
    s = verb("synth", cmd_synth, "write a seeded synthetic checkpoint")
    s.add_argument("kind", choices=["tiny", "trained", "air12", "air24"],
                   help="trained: a small model that copies (the shipped checkpoint; other seeds train here)")
    s.add_argument("dir")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--context", type=int, default=_default_context(),
                   help="tiny, trained: the context in tokens (default: the embedded default's, %(default)s)")
    s.add_argument("--device", default="cuda", help="where air12/air24 are built before saving (default: cuda)")
    s.add_argument("--dtype", choices=["float32", "bfloat16"],
                   help="trained: the weights' dtype (default: float32, as CPU serving wants; GPUs serve bfloat16)")
    dv = verb("dev", cmd_dev, "check out the series as one commit per patch in build/dev")
    dv.add_argument("--force", action="store_true", help="recreate build/dev (it must be clean)")
    verb("export", cmd_export, "rewrite the patches from build/dev's commits, keeping headers")
    measure_verbs.add_verbs(verb)
    for name, fn, help in (("start", cmd_start, "build what is missing and start serving; ready = a streamed token"),
                           ("stop", cmd_stop, "stop the server"),
                           ("status", cmd_status, "what is running: ranks, build, knobs, model, pid, health"),
                           ("logs", cmd_logs, "show the server log of rank RANK (default 0)"),
                           ("preflight", cmd_preflight,
                            "RUNTIME=docker: check both nodes before a start (PASS/FAIL, each FAIL with its fix)"),
                           ("watch", cmd_watch,
                            "keep it serving: start it when none runs, restart it when a rank dies or health "
                            "checks fail")):
        v = verb(name, fn, help)
        v.add_argument("--config", help="config file (default: config/local.env, else config/local.env.example)")
        if name == "logs":
            v.add_argument("rank", nargs="?", type=int, default=0, help="tensor-parallel rank (default: 0)")
            v.add_argument("-n", "--lines", type=int, default=50)
            v.add_argument("-f", "--follow", action="store_true")
        if name == "watch":
            v.add_argument("--interval", type=float, default=5.0, help="seconds between checks (default 5)")
            v.add_argument("--unhealthy", type=int, default=3, metavar="N",
                           help="restart after N failed health checks in a row (default 3)")
            v.add_argument("--once", action="store_true", help="check once, restart if needed, then exit")
    return p


def main(argv: list[str] | None = None) -> int:
    from .runtime.docker.image import ImageError
    from .runtime.docker.nodes import NodeError
    from .runtime.launch import LaunchError
    from .series.build import BuildError
    from .series.gitutil import GitError
    from .series.series import SeriesError
    from .series.upstream import UpstreamError

    args = parser().parse_args(argv)
    return guarded(args.verb, lambda: args.fn(args),
                   (UpstreamError, SeriesError, BuildError, LaunchError, GitError, ImageError, NodeError))

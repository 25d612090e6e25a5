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
    checked, problems = series.check(series.SERIES_DIR, upstream.ensure(lock), lock.ref_tag)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) in the series")
        return 1
    print(f"series ok: {len(checked.patches)} patches apply to {lock.name} {lock.version} with zero fuzz; "
          f"build id pb-{checked.build_id(ROOT / 'upstream.lock')}")
    return 0


def cmd_build(args) -> int:
    from . import build

    engine = build.build(None if args.pristine else _series())
    print(f"{engine.build_id}: wheel {engine.wheel.relative_to(ROOT)}, engine {engine.site.relative_to(ROOT)}")
    return 0


def cmd_docs(args) -> int:
    from .knobs import render_patches_md

    text = render_patches_md(_series())
    if args.check:
        if not DOCS_PATCHES.is_file() or DOCS_PATCHES.read_text() != text:
            print(f"{DOCS_PATCHES.relative_to(ROOT)} is stale; run `python -m patchbay docs`")
            return 1
        print(f"{DOCS_PATCHES.relative_to(ROOT)} is up to date")
        return 0
    DOCS_PATCHES.parent.mkdir(parents=True, exist_ok=True)
    DOCS_PATCHES.write_text(text)
    print(f"wrote {DOCS_PATCHES.relative_to(ROOT)}")
    return 0


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
    if args.kind != "tiny":
        raise Fail(f"synth {args.kind}: only `tiny` is written to disk (air12 is built on a GPU in memory)", 2)
    from . import synth

    path = synth.write_tiny(Path(args.dir), seed=args.seed)
    print(f"wrote synthetic:tiny (seed {args.seed}) to {path}")
    return 0


def cmd_dev(args) -> int:
    from . import devtree, upstream

    lock = _lock()
    path = devtree.create(_series(), upstream.ensure(lock), lock.ref_tag, force=args.force)
    print(f"{path}: one commit per patch on {lock.ref_tag}; edit there, then `patchbay export`")
    return 0


def cmd_export(args) -> int:
    from . import devtree

    changed = devtree.export(_series(strict=False), _lock().ref_tag)
    print("rewrote " + (", ".join(changed) if changed else "nothing (patches already match build/dev)"))
    return 0


def cmd_exact(args) -> int:
    from . import build, exact, series
    from .launch import engine_env

    if not (args.pristine or args.knob or args.batched):
        raise Fail("say what to check: --pristine, and/or --url URL with --knob PB_X=off,on or --batched N", 2)
    if (args.knob or args.batched) and not args.url:
        raise Fail("--knob and --batched check a live server: give --url", 2)
    rows = []
    if args.pristine:
        loaded, problems = series.load(Path(args.series)) if args.series else (_series(), [])
        if problems:
            raise Fail("\n".join(map(str, problems)))
        model = args.model_dir or model_path(_config(argparse.Namespace(config=None)))
        patched = exact.probe_engine(engine_env(build.build(loaded, progress=lambda *_: None), {}), model)
        pristine = exact.probe_engine(engine_env(build.build(None, progress=lambda *_: None), {}), model)
        rows += exact.check_probes(patched, pristine, "knobs unset == pristine")
    if args.url:
        model = args.model or _served_model(args.url)
        for spec in args.knob or []:
            name, _, values = spec.partition("=")
            off, _, on = values.partition(",")
            if not name.startswith("PB_") or not off or not on:
                raise Fail(f"--knob {spec}: expected PB_NAME=OFF,ON (e.g. PB_SSE_DONE=0,1)", 2)
            rows += exact.check_same_bits(args.url, model, name, off, on)
        if args.batched:
            rows += exact.check_batched(args.url, model, args.batched)
    print(exact.render(rows))
    return 0 if all(r["equal"] for r in rows) else 1


def cmd_score(args) -> int:
    from . import build, exact, series
    from .knobs import validate_settings
    from .launch import engine_env

    def side(series_dir, knob_specs, name):
        knobs = dict(spec.partition("=")[::2] for spec in knob_specs or [])
        if series_dir == "pristine":
            loaded = None
            if knobs:
                raise Fail(f"--{name}-knob: the pristine build has no knobs", 2)
        else:
            loaded, problems = series.load(Path(series_dir)) if series_dir else (_series(), [])
            if problems:
                raise Fail("\n".join(map(str, problems)))
            errors = validate_settings(loaded.knobs(), knobs, f"--{name}-knob")
            if errors:
                raise Fail("\n".join(errors), 2)
        engine = build.build(loaded, progress=lambda *_: None)
        return exact.score_engine(engine_env(engine, knobs), model)

    model = args.model_dir or model_path(_config(argparse.Namespace(config=None)))
    rows = exact.logprob_deltas(side(args.a_series, args.a_knob, "a"), side(args.b_series, args.b_knob, "b"))
    print("text  tokens  mean |Δ logprob|  max |Δ logprob|")
    for r in rows:
        print(f"{r['text']:>4}  {r['tokens']:>6}  {r['mean_abs']:>16.3g}  {r['max_abs']:>15.3g}")
    n = sum(r["tokens"] for r in rows)
    mean = sum(r["mean_abs"] * r["tokens"] for r in rows) / n
    print(f"all   {n:>6}  {mean:>16.3g}  {max(r['max_abs'] for r in rows):>15.3g}")
    return 0


def _served_model(url: str) -> str:
    import httpx

    try:
        data = httpx.get(f"{url}/v1/models", timeout=30).json().get("data") or []
    except (httpx.HTTPError, ValueError):
        data = []
    if not data:
        raise Fail(f"{url}/v1/models names no model; pass --model", 2)
    return data[0]["id"]


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
    series = _series()
    errors = validate_settings(series.knobs(), cfg.knobs, cfg.source)
    if errors:
        raise Fail("\n".join(errors), 2)
    files = launch.RunFiles(cfg.run_path)
    current = launch.running(files)
    if current:
        raise Fail(f"already running (pid {current['pid']} on {current.get('url')}); "
                   "run `scripts/serve.sh stop` first")
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

    pid = launch.stop(launch.RunFiles(_config(args).run_path))
    print(f"stopped pid {pid}" if pid else "not running")
    return 0


def cmd_status(args) -> int:
    from . import launch

    info = launch.running(launch.RunFiles(_config(args).run_path))
    if not info:
        print("not running")
        return 3
    rows = [("url", info.get("url")), ("pid", info["pid"]), ("build", info.get("build_id")),
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

    files = launch.RunFiles(_config(args).run_path)
    if not files.log.is_file():
        raise Fail("no log yet; start the server first")
    print(launch.log_tail(files.log, args.lines))
    if args.follow:
        with files.log.open() as f:
            f.seek(0, 2)
            while True:
                line = f.readline()
                if line:
                    sys.stdout.write(line)
                    sys.stdout.flush()
                else:
                    time.sleep(0.5)
    return 0


# ---- measuring ------------------------------------------------------------------------------


def _int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise Fail(f"{what} {text}: expected comma-separated whole numbers, e.g. 1,4,8", 2) from None
    if not values or min(values) < 1:
        raise Fail(f"{what} {text}: every value must be at least 1", 2)
    return values


def cmd_ab(args) -> int:
    import shlex

    from . import bench, windows

    try:
        restart = None
        if sum(bool(x) for x in (args.knob, args.a_json or args.b_json, args.a_config or args.b_config)) > 1:
            raise bench.BenchError("give one way to name the arms: --knob, --a-json/--b-json or "
                                   "--a-config/--b-config", 2)
        if args.a_config or args.b_config:
            if not (args.a_config and args.b_config):
                raise bench.BenchError("--a-config needs --b-config (two server configurations)", 2)
            arms = {"A": {}, "B": {}}
            restart = _restarter(args.a_config, args.b_config)
            args.url, args.model = restart.url, args.model or restart.model
            restart("A")
        elif args.knob:
            arms = bench.arms_from_knobs(args.knob)
        elif args.a_json is not None and args.b_json is not None:
            arms = bench.arms_from_json(args.a_json, args.b_json)
        else:
            raise bench.BenchError("name the two arms: --knob PB_X=a,b, or --a-json '{...}' --b-json '{...}'", 2)
        levels = _int_list(args.concurrency, "--concurrency")
        if args.reps < 1 or args.warmup < 0:
            raise bench.BenchError("--reps must be at least 1 and --warmup at least 0", 2)
        results_dir = Path(args.results_dir) if args.results_dir else windows.RESULTS_DIR
        if args.window:
            windows.check_slug(args.window)
        suites = [s for s in args.suites.split(",") if s] if args.suites else None
        url = args.url.rstrip("/")
        server, chosen = bench.prepare(url, args.model, suites, args.max_prompt_tokens)
        plan = bench.Plan(url=url, model=server["model"], arms=arms, prompts=chosen, levels=levels,
                          reps=args.reps, warmup=args.warmup, max_tokens=args.max_tokens, seed=args.seed,
                          timeout=args.timeout, time_limit=args.time_limit,
                          suites=sorted({p.suite for p in chosen}, key=[p.suite for p in chosen].index))
        server["build"] = bench.check_arms(plan) or server["build"]
        window = windows.create(results_dir, args.window) if args.window else None
        prog = "python -m patchbay" if sys.argv[0].endswith("__main__.py") else Path(sys.argv[0]).name
        result = bench.execute(plan, server, window, f"{prog} {shlex.join(sys.argv[1:])}",
                               progress=None if args.quiet else bench.Progress(), switch=restart,
                               restarts=restart.describe() if restart else None)
    except (bench.BenchError, windows.WindowError) as e:
        raise Fail(str(e), getattr(e, "code", 2)) from None
    finally:
        if restart:
            restart.stop()
    summary = result["summary"]
    if not args.quiet:
        for level, data in summary["levels"].items():
            print("\n".join(windows.level_table(level, data)))
    print(summary["headline"])
    if window:
        if results_dir.resolve() == windows.RESULTS_DIR.resolve():
            windows.INDEX.write_text(windows.render_index(results_dir, windows.INDEX))
        print(f"window {window}")
    if summary["errors"]:
        raise Fail(f"{summary['errors']} of {summary['requests']} requests failed; see the error field in raw.jsonl"
                   if window else f"{summary['errors']} of {summary['requests']} requests failed")
    if not summary["complete"]:
        raise Fail(f"stopped early: the run passed --time-limit {args.time_limit:g}s")
    return 0


class _restarter:
    """Arms that are two server configurations: each `switch(arm)` stops the running server and
    starts that arm's configuration (B on A's host and port), ready = a streamed token."""

    def __init__(self, a_path: str, b_path: str):
        import dataclasses

        from . import build, config, launch
        from .knobs import validate_settings

        self.launch = launch
        series = _series()
        try:
            a = config.load(Path(a_path))
            b = dataclasses.replace(config.load(Path(b_path)), host=a.host, port=a.port)
        except config.ConfigError as e:
            raise Fail(str(e), 2) from None
        errors = validate_settings(series.knobs(), a.knobs, a.source) + validate_settings(series.knobs(), b.knobs, b.source)
        if errors:
            raise Fail("\n".join(errors), 2)
        self.configs = {"A": a, "B": b}
        self.files = launch.RunFiles(ROOT / ".run" / "ab")
        self.engine = build.build(series, progress=lambda *_: None)
        self.model = model_path(a)
        self.url = a.url
        if launch.running(self.files):
            raise Fail("an earlier `ab --a-config` server is still running; stop it: kill the pid in .run/ab/server.pid")

    def __call__(self, arm: str) -> None:
        self.stop()
        self.launch.start(self.configs[arm], self.engine, self.model, self.files, progress=lambda *_: None)

    def stop(self) -> None:
        self.launch.stop(self.files)

    def describe(self) -> dict:
        return {arm: {"config": c.source, "knobs": c.knobs_on(), "engine_args": c.engine_args}
                for arm, c in self.configs.items()}


def cmd_results(args) -> int:
    from . import windows

    results_dir = Path(args.results_dir) if args.results_dir else windows.RESULTS_DIR
    index = Path(args.index) if args.index else windows.INDEX
    text = windows.render_index(results_dir, index)
    shown = index.resolve().relative_to(ROOT) if ROOT in index.resolve().parents else index
    if args.check:
        if not index.is_file() or index.read_text() != text:
            print(f"{shown} is stale; run `python -m patchbay results`")
            return 1
        print(f"{shown} is up to date ({len(windows.existing(results_dir))} windows)")
        return 0
    index.parent.mkdir(parents=True, exist_ok=True)
    index.write_text(text)
    print(f"wrote {shown} ({len(windows.existing(results_dir))} windows)")
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
    b.add_argument("--wheel", action="store_true", help="(the default) build the wheel and its engine folder")
    b.add_argument("--pristine", action="store_true", help="build upstream with no patches")
    d = verb("docs", cmd_docs, "regenerate docs/PATCHES.md from the patch headers")
    d.add_argument("--check", action="store_true", help="only report whether it is stale")
    r = verb("rebase", cmd_rebase, "report how the series applies to another upstream release")
    r.add_argument("--to", required=True, metavar="VERSION")
    r.add_argument("--sdist", help="use this sdist instead of downloading VERSION's")
    r.add_argument("--out", help="write the Markdown report here (default: print it)")
    s = verb("synth", cmd_synth, "write a seeded synthetic checkpoint")
    s.add_argument("kind", choices=["tiny", "air12"])
    s.add_argument("dir")
    s.add_argument("--seed", type=int, default=0)
    dv = verb("dev", cmd_dev, "check out the series as one commit per patch in build/dev")
    dv.add_argument("--force", action="store_true", help="recreate build/dev (it must be clean)")
    verb("export", cmd_export, "rewrite the patches from build/dev's commits, keeping headers")
    x = verb("exact", cmd_exact, "the exactness contract: knobs unset == pristine, same-bits knobs, batched == alone")
    x.add_argument("--pristine", action="store_true",
                   help="in-process: the series' build with every knob unset against the pristine build")
    x.add_argument("--series", help="with --pristine: another series folder (default: patches/)")
    x.add_argument("--model-dir", help="with --pristine: a checkpoint folder (default: the config's model)")
    x.add_argument("--url", help="a live server for --knob and --batched (it needs PB_TOKENIZE=1)")
    x.add_argument("--model", help="with --url: the model id (default: the first /v1/models lists)")
    x.add_argument("--knob", action="append", metavar="PB_X=OFF,ON", help="a same-bits knob, per request")
    x.add_argument("--batched", type=int, metavar="N", help="each prompt next to N others == alone")
    sc = verb("score", cmd_score, "teacher-forced scoring: mean and max |Δ logprob| of reference texts, A vs B")
    for arm in ("a", "b"):
        sc.add_argument(f"--{arm}-series", help=f"{arm.upper()}'s series folder, or `pristine` (default: patches/)")
        sc.add_argument(f"--{arm}-knob", action="append", metavar="PB_X=V", help=f"a knob set for {arm.upper()}")
    sc.add_argument("--model-dir", help="a checkpoint folder (default: the config's model)")
    for name, fn, help in (("start", cmd_start, "build what is missing and start serving; ready = a streamed token"),
                           ("stop", cmd_stop, "stop the server"),
                           ("status", cmd_status, "what is running: build, knobs, model, pid, health"),
                           ("logs", cmd_logs, "show the server log")):
        v = verb(name, fn, help)
        v.add_argument("--config", help="config file (default: config/local.env, else config/local.env.example)")
        if name == "logs":
            v.add_argument("-n", "--lines", type=int, default=50)
            v.add_argument("-f", "--follow", action="store_true")
    ab = verb("ab", cmd_ab, "paired A/B speed comparison of two pb_knobs settings on a live server")
    ab.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    ab.add_argument("--model", help="model id (default: the first one /v1/models lists)")
    ab.add_argument("--knob", action="append", metavar="PB_X=A,B",
                    help="arm A sends PB_X=A, arm B PB_X=B in pb_knobs (repeatable)")
    ab.add_argument("--a-json", metavar="JSON", help="arm A's whole pb_knobs object, e.g. '{}'")
    ab.add_argument("--b-json", metavar="JSON", help="arm B's whole pb_knobs object")
    ab.add_argument("--a-config", metavar="FILE", help="arm A is a server started from this config (local "
                    "runtime); with --b-config the two are restarted alternately, for knobs read at start")
    ab.add_argument("--b-config", metavar="FILE", help="arm B's config (served on A's host and port)")
    ab.add_argument("--suites", help="comma-separated prompt suites (default: all: code, json, sql, prose, "
                                     "edit, tool, count, long)")
    ab.add_argument("--concurrency", default="1", metavar="N,N,...", help="levels, run in this order (default: 1)")
    ab.add_argument("--reps", type=int, default=5, help="measured reps per level and arm (default: 5)")
    ab.add_argument("--warmup", type=int, default=1, help="reps run first and discarded (default: 1)")
    ab.add_argument("--max-tokens", type=int, help="reply length for every prompt (default: each prompt's own)")
    ab.add_argument("--max-prompt-tokens", type=int,
                    help="cut long prompts by words to fit this many prompt tokens (small models)")
    ab.add_argument("--seed", type=int, default=0, help="bootstrap seed (default: 0)")
    ab.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default: 600)")
    ab.add_argument("--time-limit", type=float, default=3600.0,
                    help="no new pass starts after this many seconds (default: 3600)")
    ab.add_argument("--window", metavar="SLUG", help="write a results window results/WNN-SLUG/")
    ab.add_argument("--results-dir", help="where windows go (default: results/)")
    ab.add_argument("--quiet", action="store_true", help="no progress bar and no tables, only the headline")
    rs = verb("results", cmd_results, "regenerate docs/RESULTS.md, the index of the results windows")
    rs.add_argument("--check", action="store_true", help="only report whether it is stale")
    rs.add_argument("--results-dir", help="the windows' folder (default: results/)")
    rs.add_argument("--index", help="the index file (default: docs/RESULTS.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    from .build import BuildError
    from .devtree import SeriesError
    from .gitutil import GitError
    from .launch import LaunchError
    from .upstream import UpstreamError

    args = parser().parse_args(argv)
    try:
        return args.fn(args)
    except Fail as e:
        print(f"patchbay {args.verb}: {e}", file=sys.stderr)
        return e.code
    except (UpstreamError, SeriesError, BuildError, LaunchError, GitError) as e:
        print(f"patchbay {args.verb}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130

"""The measuring verbs: exact, score, ab, soak, drafts, results. The CLI adds them with add_verbs; a GPU job
runs one in its own process with run(), with the same messages and exit codes.

Each cmd_* takes the parsed arguments and returns the exit code; bad input raises Fail(…, 2).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .. import ROOT
from ..runtime.models import model_path
from ..series.series import load_usable
from ..verb import Fail, generated, guarded


DRAFTS_CONTEXT = 4096  # synthetic:trained's context for `drafts`: a 1,024-token text, the template and a reply


def cmd_exact(args) -> int:
    from ..runtime.launch import engine_env
    from ..series import build
    from . import exact

    if not (args.pristine or args.knob or args.batched or args.b_url):
        raise Fail("say what to check: --pristine, and/or --url URL with --knob PB_X=off,on, --batched N or "
                   "--b-url URL", 2)
    if (args.knob or args.batched or args.b_url) and not args.url:
        raise Fail("--knob, --batched and --b-url check a live server: give --url", 2)
    if args.b_model and not args.b_url:
        raise Fail("--b-model names what --b-url serves: give --b-url", 2)
    if args.max_tokens < 1:
        raise Fail(f"--max-tokens {args.max_tokens}: must be at least 1", 2)
    rows = []
    if args.pristine:
        loaded = _load_series(args.series)
        model = _default_model(args.model_dir)
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
        if args.b_url:
            b_model = _b_model(args, model, "compare")
            try:
                rows += exact.check_servers(args.url, args.b_url, model, args.max_tokens, b_model=b_model)
            except RuntimeError as e:
                raise Fail(str(e)) from None
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    print(exact.render(rows))
    return 0 if all(r["equal"] for r in rows) else 1


def cmd_score(args) -> int:
    from ..runtime.launch import engine_env
    from ..series import build
    from ..series.knobs import validate_settings
    from . import exact

    def side(series_dir, knob_specs, name):
        knobs = dict(spec.partition("=")[::2] for spec in knob_specs or [])
        if series_dir == "pristine":
            loaded = None
            if knobs:
                raise Fail(f"--{name}-knob: the pristine build has no knobs", 2)
        else:
            loaded = _load_series(series_dir)
            errors = validate_settings(loaded.knobs(), knobs, f"--{name}-knob")
            if errors:
                raise Fail("\n".join(errors), 2)
        engine = build.build(loaded, progress=lambda *_: None)
        return exact.score_engine(engine_env(engine, knobs), model)

    if args.url:
        rows = _score_served(args)
    else:
        if args.b_url or args.together or args.model or args.b_model:
            raise Fail("--b-url, --b-model, --together and --model score live servers: give --url too", 2)
        model = _default_model(args.model_dir)
        rows = exact.logprob_deltas(side(args.a_series, args.a_knob, "a"), side(args.b_series, args.b_knob, "b"))
    print("text  tokens  mean |Δ logprob|  max |Δ logprob|")
    for r in rows:
        print(f"{r['text']:>4}  {r['tokens']:>6}  {r['mean_abs']:>16.3g}  {r['max_abs']:>15.3g}")
    n = sum(r["tokens"] for r in rows)
    mean = sum(r["mean_abs"] * r["tokens"] for r in rows) / n
    print(f"all   {n:>6}  {mean:>16.3g}  {max(r['max_abs'] for r in rows):>15.3g}")
    if args.json:
        summary = {"texts": rows, "tokens": n, "mean_abs": mean, "max_abs": max(r["max_abs"] for r in rows)}
        Path(args.json).write_text(json.dumps(summary, indent=1) + "\n")
    return 0


def _score_served(args) -> list[dict]:
    """Teacher forcing through live servers: A alone against B alone (--b-url), or A alone
    against A with every text sent at once (--together: what sharing batches changes)."""
    from . import exact

    if args.a_series or args.b_series or args.a_knob or args.b_knob or args.model_dir:
        raise Fail("--url scores what the servers run: --a-/--b-series, --a-/--b-knob and --model-dir do not "
                   "apply (start the servers with the settings to compare)", 2)
    if bool(args.b_url) == bool(args.together):
        raise Fail("with --url give exactly one of --b-url URL (A against B) or --together (A alone against "
                   "A with the texts batched)", 2)
    model = args.model or _served_model(args.url)
    try:
        a = exact.score_served(args.url, model)
        if args.b_url:
            b = exact.score_served(args.b_url, _b_model(args, model, "score"))
        else:
            b = exact.score_served(args.url, model, together=True)
    except RuntimeError as e:
        raise Fail(str(e)) from None
    for i, (x, y) in enumerate(zip(a["logprobs"], b["logprobs"])):
        if len(x) != len(y):
            raise Fail(f"text {i}: A reported {len(x)} forced tokens and B {len(y)}: the servers tokenize "
                       "differently", 1)
    return exact.logprob_deltas(a, b)


def _b_model(args, model: str, verb: str) -> str:
    """The model id server B is asked for: --b-model (another checkpoint of the model, e.g. its FP8
    copy), else A's, which B must serve too."""
    if args.b_model:
        return args.b_model
    b_model = model if args.model else _served_model(args.b_url)
    if b_model != model:
        raise Fail(f"{args.url} serves {model} but {args.b_url} serves {b_model}: {verb} the same model, or "
                   "name B's with --b-model to compare another checkpoint of it", 2)
    return b_model


def _load_series(folder: str | None):
    """The series in `folder`, or the project's own when none is given; problems end the verb."""
    from ..series import series

    if not folder:
        return load_usable()
    loaded, problems = series.load(Path(folder))
    if problems:
        raise Fail("\n".join(map(str, problems)))
    return loaded


def _default_model(model_dir: str | None) -> str:
    if model_dir:
        return model_dir
    from ..runtime import config

    try:
        return model_path(config.load(None))
    except config.ConfigError as e:
        raise Fail(str(e), 2) from None


def _served_model(url: str) -> str:
    from . import bench

    try:
        return bench.server_info(url, None)["model"]
    except bench.BenchError as e:
        raise Fail(str(e), e.code) from None


def int_list(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise Fail(f"{what} {text}: expected comma-separated whole numbers, e.g. 1,4,8", 2) from None
    if not values or min(values) < 1:
        raise Fail(f"{what} {text}: every value must be at least 1", 2)
    return values


def cmd_ab(args) -> int:
    from . import agent, agent_report, agent_run, bench, windows

    try:
        restart = None
        if sum(bool(x) for x in (args.knob, args.a_json or args.b_json, args.a_config or args.b_config)) > 1:
            raise bench.BenchError("give one way to name the arms: --knob, --a-json/--b-json or "
                                   "--a-config/--b-config", 2)
        if args.a_config or args.b_config:
            if not (args.a_config and args.b_config):
                raise bench.BenchError("--a-config needs --b-config (two server configurations)", 2)
            arms = {"A": {}, "B": {}}
            restart = _alternation(args.a_config, args.b_config)
            args.url, args.model = restart.url, args.model or restart.model
            restart("A")
        elif args.knob:
            arms = bench.arms_from_knobs(args.knob)
        elif args.a_json is not None and args.b_json is not None:
            arms = bench.arms_from_json(args.a_json, args.b_json)
        elif args.b_url:
            arms = {"A": {}, "B": {}}
        elif args.workload == "agent":
            arms = {"A": {}}  # one arm: the mode ratios alone
        else:
            raise bench.BenchError("name the two arms: --knob PB_X=a,b, or --a-json '{...}' --b-json '{...}'", 2)
        levels = int_list(args.concurrency, "--concurrency")
        if args.reps < 1 or args.warmup < 0:
            raise bench.BenchError("--reps must be at least 1 and --warmup at least 0", 2)
        results_dir = Path(args.results_dir) if args.results_dir else windows.RESULTS_DIR
        if args.window:
            windows.check_slug(args.window)
        suites = [s for s in args.suites.split(",") if s] if args.suites else None
        url = args.url.rstrip("/")
        if args.b_url and restart:
            raise bench.BenchError("--b-url names B's server; --a-config/--b-config start their own", 2)
        b_url = args.b_url.rstrip("/") if args.b_url else None
        if args.b_model and not b_url:
            raise bench.BenchError("--b-model names what --b-url serves: give --b-url", 2)
        if args.workload == "agent":
            result, window = agent_run.from_args(args, arms, url, b_url, levels, results_dir, invocation(), restart,
                                                 None if args.quiet else bench.Progress(),
                                                 None if args.quiet else lambda line: print(line, file=sys.stderr))
            return _ab_done(args, result["summary"], window, results_dir,
                            lambda level, data: agent_report.level_tables(level, data, list(arms)))
        agent_flags = [f"--{n.replace('_', '-')}" for n in agent.AGENT_ONLY if getattr(args, n) is not None]
        if agent_flags:
            raise bench.BenchError(f"{', '.join(agent_flags)}: flags of --workload agent", 2)
        server, chosen = bench.prepare(url, args.model, suites, args.max_prompt_tokens, cold=args.cold,
                                        distinct_copies=args.distinct_copies)
        if b_url:
            bench.b_server(b_url, server, args.b_model)
        plan = bench.Plan(url=url, model=server["model"], arms=arms, prompts=chosen, levels=levels,
                          reps=args.reps, warmup=args.warmup, max_tokens=args.max_tokens, seed=args.seed,
                          timeout=args.timeout, time_limit=args.time_limit,
                          suites=sorted({p.suite for p in chosen}, key=[p.suite for p in chosen].index),
                          b_url=b_url, b_model=args.b_model, cold=args.cold, distinct_copies=args.distinct_copies)
        server["build"] = bench.check_arms(plan) or server["build"]
        window = windows.create(results_dir, args.window) if args.window else None
        result = bench.execute(plan, server, window, invocation(),
                               progress=None if args.quiet else bench.Progress(), switch=restart,
                               restarts=restart.describe() if restart else None)
    except (bench.BenchError, windows.WindowError) as e:
        raise Fail(str(e), getattr(e, "code", 2)) from None
    finally:
        if restart:
            restart.stop()
    return _ab_done(args, result["summary"], window, results_dir, windows.level_table)


def _ab_done(args, summary: dict, window, results_dir: Path, table) -> int:
    """ab's tables, headline, window and exit code, whichever workload ran."""
    from . import windows

    if not args.quiet:
        for level, data in summary["levels"].items():
            print("\n".join(table(level, data)))
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


def cmd_soak(args) -> int:
    import dataclasses

    from . import bench, soak, soak_plan, soak_report, windows

    try:
        url, run_dir = args.url, args.run_dir
        if args.pid and run_dir:
            raise soak_plan.SoakError("give --pid or --run-dir, not both", 2)
        implicit = not (args.url or args.config)  # the default config's server, as `status` reads it
        if args.config or implicit:
            from ..runtime import config

            try:
                cfg = config.load(Path(args.config) if args.config else None)
            except config.ConfigError as e:
                raise Fail(str(e), 2) from None
            host = "127.0.0.1" if cfg.host in ("0.0.0.0", "::") else cfg.host
            url = url or f"http://{host}:{cfg.port}"
            if not (run_dir or args.pid) and (cfg.run_path / "server.pid").is_file():
                run_dir = str(cfg.run_path)
            elif not (run_dir or args.pid) and not implicit:
                raise soak_plan.SoakError(f"--config {args.config}: no server.pid in {cfg.run_path}; start the "
                                          "server with this config (or pass --pid)", 2)
        url = url.rstrip("/")
        soak_plan.check_loopback(url, args.allow_remote)
        if args.pid and soak.rss_kib(args.pid) is None:
            raise soak_plan.SoakError(f"--pid {args.pid}: no such process on this machine", 2)
        pid = args.pid or (soak.server_pid(Path(run_dir)) if run_dir else None)
        if args.window:
            windows.check_slug(args.window)
        settings = soak_plan.Settings(
            url=url, clients=args.clients,
            duration_s=soak_plan.parse_duration(args.duration), max_tokens=args.max_tokens, timeout_s=args.timeout,
            disconnect_after=args.disconnect_after, disconnect_timeout_s=args.disconnect_timeout,
            mix=soak_plan.parse_mix(args.mix, args.no_bad), bad=tuple(soak_plan.parse_bad(args.bad)),
            prompt_words=args.prompt_words, seed=args.seed, sample_every_s=args.sample_every, grace_s=args.grace,
            pid=pid, bucket_s=args.bucket, rss_window_s=args.rss_window, max_unexpected=args.max_unexpected,
            max_leaked=args.max_leaked, max_rss_growth=args.max_rss_growth / 100)
        server = bench.server_info(url, args.model)
        settings = dataclasses.replace(settings, model=server["model"], build=server["build"])
        words, context = soak.fit_words(settings)
        if words < settings.prompt_words:
            if not args.quiet:
                print(f"prompts carry {words} words of text, not {settings.prompt_words}: the longest must fit "
                      f"the model's {context}-token context with 4x --max-tokens", file=sys.stderr)
            settings = dataclasses.replace(settings, prompt_words=words)
        results_dir = Path(args.results_dir) if args.results_dir else windows.RESULTS_DIR
        window = windows.create(results_dir, args.window) if args.window else None
        result = soak.execute(settings, window, invocation(),
                              progress=None if args.quiet else soak.Progress())
    except (soak_plan.SoakError, bench.BenchError, windows.WindowError) as e:
        raise Fail(str(e), getattr(e, "code", 2)) from None
    summary = result["summary"]
    if not args.quiet:
        print(soak_report.render_console(summary))
    print(summary["headline"])
    if window:
        if results_dir.resolve() == windows.RESULTS_DIR.resolve():
            windows.INDEX.write_text(windows.render_index(results_dir, windows.INDEX))
        print(f"window {window}")
    return 0 if summary["ok"] else 1


def _alternation(a_path: str, b_path: str):
    """The two configs of `ab --a-config/--b-config`, checked, as a launch.Alternation (B is served
    on A's host and port)."""
    import dataclasses

    from ..series import build

    from ..runtime import config, launch
    from ..series.knobs import validate_settings

    series = load_usable()
    try:
        a = config.load(Path(a_path))
        b = dataclasses.replace(config.load(Path(b_path)), host=a.host, port=a.port)
    except config.ConfigError as e:
        raise Fail(str(e), 2) from None
    errors = [e for c in (a, b) for e in validate_settings(series.knobs(), c.knobs, c.source)]
    if errors:
        raise Fail("\n".join(errors), 2)
    files = launch.RunFiles(ROOT / ".run" / "ab")
    if launch.running(files):
        raise Fail(f"an earlier `ab --a-config` server is still running; kill the pid in {files.pid}")
    return launch.Alternation({"A": a, "B": b}, build.build(series, progress=lambda *_: None), model_path(a), files)


def cmd_drafts(args) -> int:
    from ..runtime import trained
    from ..runtime.launch import engine_env
    from ..runtime.models import trained_path
    from ..runtime.synth import air12_config
    from ..series import build
    from . import draft, windows

    if args.max_tokens < 1:
        raise Fail(f"--max-tokens {args.max_tokens}: must be at least 1", 2)
    results_dir = Path(args.results_dir) if args.results_dir else windows.RESULTS_DIR
    try:
        if args.window:
            windows.check_slug(args.window)
        model = args.model_dir
        if not model:
            model = str(trained_path(0, DRAFTS_CONTEXT))
            trained.write_trained(model, 0, DRAFTS_CONTEXT)
        engine = build.build(_load_series(args.series), progress=lambda *_: None)
        try:
            found = draft.probe_engine(engine_env(engine, {}), model, args.max_tokens)
        except RuntimeError as e:
            raise Fail(str(e)) from None
        rows = draft.summarize(found["records"], air12_config())
        table = draft.render(rows)
        headline = draft.headline(rows, Path(model).name)
        print(table + headline)
        if args.window:
            window = windows.create(results_dir, args.window)
            windows.write_start(window, invocation(), {"model": model, "max_tokens": args.max_tokens,
                                                       "draft_lengths": list(draft.DRAFT_LENGTHS),
                                                       "ngrams": [list(n) for n in draft.NGRAMS]})
            windows.append_raw(window, found["records"])
            summary = {"headline": headline, "rows": rows}
            windows.write_summary(window, summary, lambda name, command, mach: (
                f"# {name}: {headline}\n\nCommand: `{command}`\n\nMachine: {mach.get('cpus')} CPUs, "
                f"torch {mach.get('torch')}\n\n{table}"))
            if results_dir.resolve() == windows.RESULTS_DIR.resolve():
                windows.INDEX.write_text(windows.render_index(results_dir, windows.INDEX))
            print(f"window {window}")
    except windows.WindowError as e:
        raise Fail(str(e), 2) from None
    return 0


def invocation() -> str:
    """This process's command line as typed: `python -m patchbay ab …` (or `python -m
    patchbay.device ab …` on a GPU machine), a script by its name."""
    import shlex

    argv0 = Path(sys.argv[0])
    if argv0.name == "__main__.py" and "patchbay" in argv0.resolve().parent.parts:
        parts = argv0.resolve().parent.parts
        prog = "python -m " + ".".join(parts[len(parts) - 1 - parts[::-1].index("patchbay"):])
    else:
        prog = argv0.name
    return f"{prog} {shlex.join(sys.argv[1:])}"


def cmd_results(args) -> int:
    from . import windows

    results_dir = Path(args.results_dir) if args.results_dir else windows.RESULTS_DIR
    index = Path(args.index) if args.index else windows.INDEX
    return generated(index, windows.render_index(results_dir, index), args.check, "python -m patchbay results",
                     f" ({len(windows.existing(results_dir))} windows)")


def add_verbs(verb) -> None:
    from . import agent, soak_plan

    x = verb("exact", cmd_exact, "the exactness contract: knobs unset == pristine, same-bits knobs, batched == alone")
    x.add_argument("--pristine", action="store_true",
                   help="in-process: the series' build with every knob unset against the pristine build")
    x.add_argument("--series", help="with --pristine: another series folder (default: patches/)")
    x.add_argument("--model-dir", help="with --pristine: a checkpoint folder (default: the config's model)")
    x.add_argument("--url", help="a live server for --knob and --batched (it needs PB_TOKENIZE=1)")
    x.add_argument("--model", help="with --url: the model id (default: the first /v1/models lists)")
    x.add_argument("--knob", action="append", metavar="PB_X=OFF,ON", help="a same-bits knob, per request")
    x.add_argument("--batched", type=int, metavar="N", help="each prompt next to N others == alone")
    x.add_argument("--b-url", metavar="URL", help="with --url: each prompt's greedy reply from this other server "
                   "(the same model served another way, e.g. TP=2 against TP=1) == from --url")
    x.add_argument("--max-tokens", type=int, default=16, help="with --b-url: reply length compared "
                   "(default: %(default)s)")
    x.add_argument("--b-model", help="with --b-url: the model id B serves, when it is another checkpoint of A's "
                   "model (its FP8 copy, say); default: A's")
    x.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    sc = verb("score", cmd_score, "teacher-forced scoring: mean and max |Δ logprob| of reference texts, A vs B")
    for arm in ("a", "b"):
        sc.add_argument(f"--{arm}-series", help=f"{arm.upper()}'s series folder, or `pristine` (default: patches/)")
        sc.add_argument(f"--{arm}-knob", action="append", metavar="PB_X=V", help=f"a knob set for {arm.upper()}")
    sc.add_argument("--model-dir", help="a checkpoint folder (default: the config's model)")
    sc.add_argument("--url", help="score through this live server's decode path instead (PB_FORCED_DECODING=1)")
    sc.add_argument("--b-url", metavar="URL", help="with --url: B is this other live server")
    sc.add_argument("--model", help="with --url: the model id (default: the first one /v1/models lists)")
    sc.add_argument("--b-model", help="with --b-url: the model id B serves, when it is another checkpoint of A's "
                    "model (its FP8 copy, say); default: A's")
    sc.add_argument("--together", action="store_true",
                    help="with --url: B is the same server with every text sent at once (batched)")
    sc.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    ab = verb("ab", cmd_ab, "paired A/B speed comparison of two pb_knobs settings on a live server")
    ab.add_argument("--url", default="http://127.0.0.1:8000", help="the server (default: %(default)s)")
    ab.add_argument("--b-url", metavar="URL", help="arm B is this other server (the same model), for settings "
                    "read at start; passes still alternate A B A B")
    ab.add_argument("--model", help="model id (default: the first one /v1/models lists)")
    ab.add_argument("--b-model", help="with --b-url: the model id B serves, when it is another checkpoint of A's "
                    "model (its FP8 copy, say); default: A's")
    ab.add_argument("--knob", action="append", metavar="PB_X=A,B",
                    help="arm A sends PB_X=A, arm B PB_X=B in pb_knobs (repeatable)")
    ab.add_argument("--a-json", metavar="JSON", help="arm A's whole pb_knobs object, e.g. '{}'")
    ab.add_argument("--b-json", metavar="JSON", help="arm B's whole pb_knobs object")
    ab.add_argument("--a-config", metavar="FILE", help="arm A is a server started from this config (local "
                    "runtime); with --b-config the two are restarted alternately, for knobs read at start")
    ab.add_argument("--b-config", metavar="FILE", help="arm B's config (served on A's host and port)")
    ab.add_argument("--suites", help="comma-separated prompt suites (default: code, json, sql, prose, edit, "
                                     "tool, count, long; also prefill, a long prompt to cut with "
                                     "--max-prompt-tokens)")
    ab.add_argument("--concurrency", default="1", metavar="N,N,...", help="levels, run in this order (default: 1)")
    ab.add_argument("--reps", type=int, default=5, help="measured reps per level and arm (default: 5)")
    ab.add_argument("--warmup", type=int, default=1, help="reps run first and discarded (default: 1)")
    ab.add_argument("--max-tokens", type=int, help="reply length for every prompt (default: each prompt's own)")
    ab.add_argument("--max-prompt-tokens", type=int,
                    help="cut long prompts by words to fit this many prompt tokens (small models)")
    ab.add_argument("--cold", action="store_true",
                    help="start every request with a line of its own, so no prompt page is cached and TTFT is a "
                         "cold prefill (replies then differ between requests); --max-prompt-tokens then "
                         "counts that line")
    ab.add_argument("--distinct-copies", action="store_true",
                    help="where a level sends a prompt several times, copies 2, 3, ... open with the line "
                         "'Copy N.', the same in both arms: no two requests are alike (identical copies "
                         "get identical replies from a batch-invariant engine, which route to the same "
                         "experts and flatter an MoE's decode)")
    agent.add_arguments(ab)
    ab.add_argument("--seed", type=int, default=0, help="bootstrap seed, and with --workload agent the choice of "
                    "texts and each sampled request's seed (default: 0)")
    ab.add_argument("--timeout", type=float, default=600.0, help="seconds per request (default: 600)")
    ab.add_argument("--time-limit", type=float, default=3600.0,
                    help="no new pass starts after this many seconds (default: 3600)")
    ab.add_argument("--window", metavar="SLUG", help="write a results window results/WNN-SLUG/")
    ab.add_argument("--results-dir", help="where windows go (default: results/)")
    ab.add_argument("--quiet", action="store_true", help="no progress bar and no tables, only the headline")
    sk = verb("soak", cmd_soak, "N clients for a while against a local server: every kind of request, disconnects "
              "and malformed ones; unexpected answers, leaked slots, what requests left behind and RSS growth fail it")
    d = soak_plan.Settings
    sk.add_argument("--url", help="the server (default: the config's URL); loopback only")
    sk.add_argument("--allow-remote", action="store_true", help="soak a server that is not on a loopback address")
    sk.add_argument("--config", help="the server's config: its URL, and RUN_DIR's server.pid for the RSS (default: "
                    "config/local.env, else config/local.env.example, unless --url is given)")
    sk.add_argument("--run-dir", help="the server's run folder: its server.pid is the process whose RSS is read")
    sk.add_argument("--pid", type=int, help="the server process whose RSS is read (instead of --run-dir)")
    sk.add_argument("--model", help="model id (default: the first one /v1/models lists)")
    sk.add_argument("--clients", type=int, default=d.clients, help="concurrent clients (default: %(default)s)")
    sk.add_argument("--duration", default="10m", help="how long: 45s, 10m, 2h; a bare number is minutes (default: %(default)s)")
    sk.add_argument("--mix", metavar="FAMILY=W,...", help="send only the families named, with these weights "
                    f"(default: {','.join(f'{k}={v}' for k, v in soak_plan.DEFAULT_MIX.items())})")
    sk.add_argument("--no-bad", action="store_true", help="no malformed requests (the default mix, or --mix's, with bad=0)")
    sk.add_argument("--bad", metavar="CASE,...", help=f"the malformed cases sent (default: all: "
                    f"{', '.join(soak_plan.BAD_CASES)})")
    sk.add_argument("--max-tokens", type=int, default=d.max_tokens, help="a good request's max_tokens "
                    "(default: %(default)s)")
    sk.add_argument("--timeout", type=float, default=d.timeout_s, help="seconds a request may take in all "
                    "(default: %(default)s)")
    sk.add_argument("--disconnect-after", type=int, default=d.disconnect_after,
                    help="a disconnecting stream closes after this many chunks (default: %(default)s)")
    sk.add_argument("--disconnect-timeout", type=float, default=d.disconnect_timeout_s,
                    help="a disconnecting non-streamed request gives up after this many seconds (default: %(default)s)")
    sk.add_argument("--prompt-words", type=int, default=d.prompt_words,
                    help="words of real text in each prompt after its instruction (default: %(default)s)")
    sk.add_argument("--seed", type=int, default=d.seed, help="the draw of request kinds (default: %(default)s)")
    sk.add_argument("--sample-every", type=float, default=d.sample_every_s,
                    help="seconds between samples of RSS and running requests (default: %(default)s)")
    sk.add_argument("--grace", type=float, default=d.grace_s, help="seconds after the run for the running "
                    "count to return to 0 (default: %(default)s)")
    sk.add_argument("--bucket", type=float, help="latency buckets, seconds (default: 60, narrower under 10 minutes)")
    sk.add_argument("--rss-window", type=float, default=d.rss_window_s, help="RSS growth compares the medians of "
                    "the first and last this many seconds (at most a third of the run; default: %(default)s)")
    sk.add_argument("--max-unexpected", type=int, default=d.max_unexpected,
                    help="unexpected answers allowed (default: %(default)s)")
    sk.add_argument("--max-leaked", type=int, default=d.max_leaked,
                    help="requests still running after the grace allowed (default: %(default)s)")
    sk.add_argument("--max-rss-growth", type=float, default=d.max_rss_growth * 100, metavar="PCT",
                    help="RSS growth allowed, percent (default: %(default)g)")
    sk.add_argument("--window", metavar="SLUG", help="write a results window results/WNN-SLUG/")
    sk.add_argument("--results-dir", help="where windows go (default: results/)")
    sk.add_argument("--quiet", action="store_true", help="no progress lines and no table, only the headline")
    dr = verb("drafts", cmd_drafts, "what prompt-lookup drafting would accept on a model's own greedy and "
              "sampled replies (edits of files, summaries of prose), read off the serial replies")
    dr.add_argument("--model-dir", help="a checkpoint folder (default: synthetic:trained, seed 0)")
    dr.add_argument("--series", help="another series folder (default: patches/); the knobs stay unset")
    dr.add_argument("--max-tokens", type=int, default=256, help="reply length (default: %(default)s)")
    dr.add_argument("--window", metavar="SLUG", help="write a results window results/WNN-SLUG/")
    dr.add_argument("--results-dir", help="where windows go (default: results/)")
    rs = verb("results", cmd_results, "regenerate docs/RESULTS.md, the index of the results windows")
    rs.add_argument("--check", action="store_true", help="only report whether it is stale")
    rs.add_argument("--results-dir", help="the windows' folder (default: results/)")
    rs.add_argument("--index", help="the index file (default: docs/RESULTS.md)")


def run(verb: str, argv: list[str]) -> int:
    """`patchbay VERB ARGV...` (exact, score, ab, soak or results) in this process: the same parsing,
    messages and exit codes as the CLI's."""
    from ..runtime.launch import LaunchError
    from ..series.build import BuildError
    from ..series.gitutil import GitError
    from ..series.series import SeriesError
    from ..series.upstream import UpstreamError

    p = argparse.ArgumentParser(prog="patchbay")
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")

    def add(name, fn, help):
        s = sub.add_parser(name, help=help, description=help)
        s.set_defaults(fn=fn)
        return s

    add_verbs(add)
    args = p.parse_args([verb, *argv])
    return guarded(verb, lambda: args.fn(args), (UpstreamError, SeriesError, BuildError, LaunchError, GitError))

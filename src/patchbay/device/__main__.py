"""`python -m patchbay.device VERB`: the GPU machine's jobs, one entry point.

There they run through scripts/gpu-run.sh; `wheels` and `profile window` run here.

    serve, ab, exact, agent, served-profile, wheels   this parser's verbs
    moe, invariance, profile, profiled, memfit, sweep, sampler, fp8  each parses its own flags (its module's main)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .. import ROOT
from .servers import MODELS


def _moe(argv: list[str]) -> int:
    from .gpu_moe import main

    return main(argv)


def _invariance(argv: list[str]) -> int:
    from .gpu_invariance import main

    return main(argv)


def _profile(argv: list[str]) -> int:
    if argv[:1] == ["window"]:
        from .profile_window import main

        return main(argv[1:])
    from .gpu_profile import main

    return main(argv)


def _profiled(argv: list[str]) -> int:
    from .served_profile import main

    return main(argv)


def _memfit(argv: list[str]) -> int:
    from .memfit import main

    return main(argv)


def _sampler(argv: list[str]) -> int:
    from .gpu_sampler import main

    return main(argv)


def _fp8(argv: list[str]) -> int:
    from .gpu_fp8 import main

    return main(argv)


def _sweep(argv: list[str]) -> int:
    from .sweep import main

    return main(argv)


# Verbs that parse their own flags: VERB -> (its main, its help).
OWN_FLAGS = {
    "moe": (_moe, "one MoE layer's experts implementations against the roofline (`moe table FILE`: its table)"),
    "invariance": (_invariance, "which operations of a layer keep a row's bits among 1-512 rows"),
    "profile": (_profile, "engine settings side by side in one process, their decode steps' kernels "
                          "(`profile window`: a results window of such runs)"),
    "profiled": (_profiled, "OUT_DIR -- MODULE ARGS: run `python -m MODULE` under the served-profile profiler"),
    "memfit": (_memfit, "OUT: a full KV pool of cold prompts at once against one server, GPU memory sampled"),
    "sampler": (_sampler, "OUT: 0100's row-by-row sampler against 0630's batched one, per step, alone vs batched"),
    "fp8": (_fp8, "0810's FP8 products at Air's shapes against their bf16 twin, graphed, timed, bits checked "
                  "(`fp8 table FILE`: its table)"),
    "sweep": (_sweep, "gemm|moe OUT: the engine's kernels' launch tiles, bits checked, timed"),
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m patchbay.device", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    s = sub.add_parser("serve", help="serve synthetic:air12 (or --model) until interrupted")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--model", default="synthetic:air12", choices=MODELS,
                   help="what to build in memory: air12 (bf16), air12 in FP8, or full-size Air in FP8 (the FP8 "
                   "ones need PB_FP8_WEIGHTS=1); default: %(default)s")
    s.add_argument("--cuda-graphs", action="store_true", help="upstream's --cb-use-cuda-graph")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--compile", action="store_true", help="upstream's --compile (sequential path, no batching)")
    s.add_argument("--num-blocks", type=int, help="KV cache pages of 256 tokens (default: upstream's, from free memory)")
    b = sub.add_parser("ab", help="serve air12, run `patchbay ab` against it, stop (ab's own flags follow --)")
    b.add_argument("--port", type=int, default=8000)
    b.add_argument("--cuda-graphs", action="store_true")
    b.add_argument("--compile", action="store_true")
    b.add_argument("--a-env", metavar="JSON", help="arm A is a server started with these PB_* variables (a JSON "
                   "object, a knob set such as @prod, or @prod+JSON)")
    b.add_argument("--b-env", metavar="JSON", help="arm B is a second server, side by side, with these")
    b.add_argument("--num-blocks", type=int,
                   help="KV pages of 256 tokens: with --a-env/--b-env or --model-dir each server's (default: 192), "
                   "alone the one server's (default: upstream's, from the memory left)")
    b.add_argument("--logs", default="/tmp/pb-ab-logs", help="with --a-env/--b-env: the servers' logs")
    b.add_argument("--model-dir", help="serve this checkpoint (`patchbay synth air12 DIR`) instead of air12 in "
                   "memory: with --a-env/--b-env as --a-tp / --b-tp ranks, alone as one server of --a-tp ranks "
                   "with the production knobs (ab's arms then per-request knobs, or --b-url to itself)")
    b.add_argument("--a-engine", metavar="DIR", help="with --a-env/--b-env: arm A's engine is the transformers "
                   "installed in DIR (another build), first on its PYTHONPATH")
    b.add_argument("--b-engine", metavar="DIR", help="the same for arm B")
    b.add_argument("--a-tp", type=int, default=1)
    b.add_argument("--b-tp", type=int, default=1)
    b.add_argument("--a-model", default="synthetic:air12", choices=MODELS,
                   help="what arm A builds in memory (no --model-dir; without --a-env/--b-env the one server's "
                   "model, served with this process's PB_* variables; default: %(default)s)")
    b.add_argument("--b-model", default="synthetic:air12", choices=MODELS,
                   help="the same for arm B (synthetic:air12-fp8 against A's air12: FP8 weights paired with bf16)")
    b.add_argument("--score", metavar="DIR", help="with --a-env/--b-env: then teacher-forced |Δ logprob| through "
                   "both servers into DIR (both envs need PB_FORCED_DECODING=1)")
    b.add_argument("ab_args", nargs=argparse.REMAINDER)
    x = sub.add_parser("exact", help="HTTP transcripts of air12: pristine upstream vs the patched build, knobs unset")
    x.add_argument("--out", required=True)
    g = sub.add_parser("agent", help="the agent API's device checks on air12 (and, without graphs, its cost)")
    g.add_argument("--out", required=True)
    g.add_argument("--cuda-graphs", action="store_true")
    g.add_argument("--graph-sampling", action="store_true", help="PB_GRAPH_SAMPLING=1 (0210)")
    g.add_argument("ab_args", nargs=argparse.REMAINDER, help="`patchbay ab` flags for the cost A/B (after --)")
    f = sub.add_parser("served-profile", help="profile the decode steps of a live server (every TP rank) "
                       "under load, collectives included")
    f.add_argument("--out", required=True)
    f.add_argument("--port", type=int, default=8000)
    f.add_argument("--cuda-graphs", action="store_true")
    f.add_argument("--env", default="{}", metavar="JSON", help="the server's PB_* variables")
    f.add_argument("--num-blocks", type=int, default=192)
    f.add_argument("--model-dir", help="serve this checkpoint as --tp ranks (default: air12 in memory, one rank)")
    f.add_argument("--tp", type=int, default=1)
    f.add_argument("--levels", default="1,8,32")
    f.add_argument("--tokens", type=int, default=1024, help="each stream's reply length (longer than the window)")
    f.add_argument("--window-s", type=float, default=1.0, help="seconds profiled at each level")
    f.add_argument("--distinct-prompts", action="store_true",
                   help="each stream its own prompt (on an MoE model its own experts); default: identical streams")
    w = sub.add_parser("wheels", help="gather the carried wheels into a folder (run here, not there)")
    w.add_argument("dest", nargs="?", default=str(ROOT / ".whl"))
    w.add_argument("--patched-only", action="store_true",
                   help="leave upstream's engine out (the tree and both engines pass the 64 MiB a call carries)")
    w.add_argument("--no-tests", action="store_true",
                   help="leave pytest and its dependencies out (1.7 MiB) when no GPU test runs there")
    for name, (_, help) in OWN_FLAGS.items():
        sub.add_parser(name, help=help, add_help=False)  # parsed by its own module (main)
    return p


def main(argv: list[str]) -> int:
    if argv[:1] and argv[0] in OWN_FLAGS:
        return OWN_FLAGS[argv[0]][0](argv[1:])
    args = parser().parse_args(argv)
    if args.verb == "wheels":
        from ..series import build, series
        from .gpu import carry_report, gather_wheels

        loaded, problems = series.load()
        if problems:
            print("\n".join(map(str, problems)), file=sys.stderr)
            return 1
        engines = ([] if args.patched_only else [build.build(None).wheel]) + [build.build(loaded).wheel]
        wheels = gather_wheels(Path(args.dest), engines, tests=not args.no_tests)
        for wheel in wheels:
            print(wheel.name)
        print(carry_report(ROOT, wheels), file=sys.stderr)
        return 0
    if args.verb == "ab":
        from ..measure.verbs import run
        from .gpu import checkpoint_ab, parse_env, side_by_side
        from .servers import with_server

        ab_args = [a for a in args.ab_args if a != "--"]
        if args.a_env is not None or args.b_env is not None:
            if args.a_env is None or args.b_env is None:
                raise SystemExit("--a-env needs --b-env")
            envs = [parse_env(args.a_env, "--a-env"), parse_env(args.b_env, "--b-env")]
            if (args.a_tp, args.b_tp) != (1, 1) and not args.model_dir:
                raise SystemExit("--a-tp/--b-tp need --model-dir: tensor-parallel ranks load a checkpoint")
            return side_by_side(args.cuda_graphs, args.port, envs, args.num_blocks or 192, Path(args.logs), ab_args,
                                args.model_dir, (args.a_tp, args.b_tp),
                                score=Path(args.score) if args.score else None,
                                engines=(args.a_engine, args.b_engine), models=(args.a_model, args.b_model))
        if args.model_dir:  # one server of the checkpoint; ab's arms are per-request knobs (or --b-url)
            return checkpoint_ab(args.model_dir, args.a_tp, args.port, args.cuda_graphs, args.num_blocks or 192,
                                 Path(args.logs), ab_args)
        # one server of --a-model with this process's PB_* variables (ab's arms: per-request knobs)
        return with_server(args.cuda_graphs, args.port,
                           lambda url: run("ab", ["--url", url, "--model", args.a_model, *ab_args]),
                           compile=args.compile, num_blocks=args.num_blocks, model_name=args.a_model)
    if args.verb == "exact":
        from .gpu import exact_job

        return exact_job(Path(args.out))
    if args.verb == "served-profile":
        if args.tp != 1 and not args.model_dir:
            raise SystemExit("--tp needs --model-dir: tensor-parallel ranks load a checkpoint")
        from ..measure.verbs import int_list
        from ..verb import Fail
        from .gpu import parse_env
        from .served_profile import served_profile_job

        try:
            levels = int_list(args.levels, "--levels")  # as `patchbay ab --concurrency` reads its levels
        except Fail as e:
            raise SystemExit(str(e)) from None
        return served_profile_job(Path(args.out), levels, args.tokens, args.window_s, parse_env(args.env, "--env"),
                                  args.cuda_graphs, args.num_blocks, args.model_dir, args.tp, args.port,
                                  distinct=args.distinct_prompts)
    if args.verb == "agent":
        from .gpu import agent_job

        return agent_job(Path(args.out), args.cuda_graphs, [a for a in args.ab_args if a != "--"],
                         args.graph_sampling)
    from .servers import serve_forever

    return serve_forever(args.port, args.cuda_graphs, args.seed, compile=args.compile, num_blocks=args.num_blocks,
                         model_name=args.model)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Clients for the hook measurements, against a running server (or a `patchbay.device` job):

    python -m patchbay.measure.tools.client cold URL OUT N [--max-prompt-tokens 8192] [--max-tokens 4]
        N cold prompts one at a time (each opens with its own line: nothing cached), 0.5 s apart;
        OUT gets each request's send, first-token and end wall-clock seconds (timeline.py reads it,
        against timing_hook's log, which is on the same clock)
    python -m patchbay.measure.tools.client decode URL TOKENS REPS
        one greedy count-suite reply of TOKENS tokens at a time (C1 decode), REPS times; tok/s each
    python -m patchbay.measure.tools.client epoch FILE [--module patchbay.device] -- ARGS...
        runs `python -m MODULE ARGS` (default module patchbay.device) with patchbay.bench.run made to
        write its clock's epoch to FILE first (`EPOCH <perf_counter s>`): raw.jsonl's times are
        seconds after it, and stall_hook's events are on that clock (stalls.py)

Each writes a command.txt line beside its output (decode: in the current folder).
Replaces W09/W10's api-ttft-timeline / host-reset-timeline client.py, W10's
tp1-decode-host-profile/client.py and W15's epoch_client.py.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import time
from pathlib import Path

from patchbay.measure.tools import record


def wall_epoch() -> float:
    """An epoch for bench.run_request that makes its times wall-clock seconds (time.time())."""
    return time.perf_counter() - time.time()


def cold_requests(client, plan, prompt, n: int, out: Path, pause: float = 0.5, say=print) -> list[dict]:
    """n requests for prompt, one at a time; appends `send first end` per request to out."""
    from patchbay.measure import bench

    recs = []
    with out.open("w") as f:
        for i in range(n):
            rec = bench.run_request(client, plan, bench.request_body(plan, prompt, "A"), wall_epoch())
            end = time.time()
            first = rec["t_first"] or end
            f.write(f"{rec['t_start']} {first} {end}\n")
            f.flush()
            say(f"request {i}: ttft {1000 * (first - rec['t_start']):.1f} ms, total "
                f"{1000 * (end - rec['t_start']):.1f} ms" + (f", {rec['error']}" if rec["error"] else ""))
            recs.append(rec)
            if i + 1 < n:
                time.sleep(pause)
    return recs


def decode_rate(rec: dict) -> float | None:
    """Tokens a second after the first one, from one bench.run_request record."""
    if rec["error"] or not rec["completion_tokens"] or rec["t_last"] is None or rec["t_last"] <= rec["t_first"]:
        return None
    return (rec["completion_tokens"] - 1) / (rec["t_last"] - rec["t_first"])


def with_epoch(path: Path, module: str, args: list[str]) -> None:
    """Run module as __main__ with args, bench.run writing its epoch to path first."""
    from patchbay.measure import bench

    run = bench.run

    def run_with_epoch(plan, sink, progress=None, switch=None):
        line = f"EPOCH {time.perf_counter():.6f}"
        path.write_text(line + "\n")
        print(line, flush=True)
        return run(plan, sink, progress, switch)

    bench.run = run_with_epoch
    sys.argv = [module, *args]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        bench.run = run


def _plan(url: str, suite: str, max_prompt_tokens: int | None, max_tokens: int, cold: bool, timeout: float):
    from patchbay.measure import bench

    info, chosen = bench.prepare(url, None, [suite], max_prompt_tokens, cold=cold)
    plan = bench.Plan(url=url, model=info["model"], arms={"A": {}, "B": {}}, prompts=chosen, levels=[1], reps=1,
                      warmup=0, max_tokens=max_tokens, cold=cold, timeout=timeout)
    return plan, chosen[0]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m patchbay.measure.tools.client", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    c = sub.add_parser("cold", help="cold prompts one at a time; their send/first/end times")
    c.add_argument("url")
    c.add_argument("out", type=Path)
    c.add_argument("n", type=int)
    c.add_argument("--max-prompt-tokens", type=int, default=8192)
    c.add_argument("--max-tokens", type=int, default=4)
    d = sub.add_parser("decode", help="one count reply at a time; decode tok/s")
    d.add_argument("url")
    d.add_argument("tokens", type=int)
    d.add_argument("reps", type=int)
    e = sub.add_parser("epoch", help="a patchbay.device (or MODULE) job with bench.run's epoch in FILE")
    e.add_argument("file", type=Path)
    e.add_argument("--module", default="patchbay.device", help="run as python -m MODULE (default: %(default)s)")
    # what follows -- is the job's: split before argparse, which would read its flags as ours
    ours, rest = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = p.parse_args(ours)

    if args.verb == "epoch":
        record.write_command(args.file.parent, "client", argv)
        with_epoch(args.file, args.module, rest)
        return 0

    import httpx

    from patchbay.measure import bench

    try:
        if args.verb == "cold":
            plan, prompt = _plan(args.url, "prefill", args.max_prompt_tokens, args.max_tokens, True, 120)
            record.write_command(args.out.parent, "client", argv)
            with httpx.Client(timeout=120) as client:
                recs = cold_requests(client, plan, prompt, args.n, args.out)
        else:
            plan, prompt = _plan(args.url, "count", None, args.tokens, False, 300)
            record.write_command(Path.cwd(), "client", argv)
            with httpx.Client(timeout=300) as client:
                recs = []
                for i in range(args.reps):
                    rec = bench.run_request(client, plan, bench.request_body(plan, prompt, "A"), time.perf_counter())
                    rate = decode_rate(rec)
                    print(f"request {i}: {rec['completion_tokens']} tokens, decode "
                          + (f"{rate:.1f} tok/s" if rate else f"- ({rec['error']})"), flush=True)
                    recs.append(rec)
    except bench.BenchError as e:
        print(f"client: {e}", file=sys.stderr)
        return 2
    return 1 if any(r["error"] for r in recs) else 0


if __name__ == "__main__":
    sys.exit(main())

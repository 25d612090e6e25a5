"""Does a model fit with its KV pool full? One server (TP ranks, CUDA graphs, PAGES pages of 256
tokens) gets STREAMS cold prompts of about PROMPT tokens at once (short replies) while nvidia-smi
samples the GPUs' memory every 0.2 s. On the GPU machine, through scripts/gpu-run.sh patched:

    python3 -m patchbay.device memfit OUT --env @prod [--tp 1] [--streams 32] [--pages 1024]
        [--prompt-tokens 8100] [--max-tokens 64] [--model-dir /tmp/air12]

Writes OUT/memfit.json (how many were served, their first tokens, each GPU's memory ready and at
its peak) and OUT/command.txt; the server's log is under OUT/logs. A failed request's record
carries the server's error event. Replaces W10's memory-tp1-32/memfit.py.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path

from patchbay.measure.tools import record

PAGE_TOKENS = 256  # the engine's KV page (a block of --cb-num-blocks)


def pages_for(prompt_tokens: int, max_tokens: int, page: int = PAGE_TOKENS) -> int:
    """Pages one request holds at its end: its prompt and its reply."""
    return -(-(prompt_tokens + max_tokens) // page)


def fits(pages: int, streams: int, prompt_tokens: int, max_tokens: int, page: int = PAGE_TOKENS) -> bool:
    """Whether `streams` such requests fit in the pool at once (no page shared between them)."""
    return streams * pages_for(prompt_tokens, max_tokens, page) <= pages


def parse_smi(text: str) -> list[tuple[int, int]]:
    """`nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits` -> one
    (used MiB, total MiB) per GPU."""
    out = []
    for line in text.splitlines():
        if line.strip():
            used, total = (int(x) for x in line.split(","))
            out.append((used, total))
    return out


def smi() -> list[tuple[int, int]]:
    proc = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,memory.total", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=True)
    return parse_smi(proc.stdout)


class Sampler:
    """Memory used on each GPU, every `every` s, on a thread."""

    def __init__(self, read=smi, every: float = 0.2):
        self.read, self.every, self.samples = read, every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="memfit-sampler")

    def _run(self):
        while not self._stop.is_set():
            self.samples.append((time.time(), [used for used, _ in self.read()]))
            self._stop.wait(self.every)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def report(recs: list[dict], samples: list, ready: list[tuple[int, int]], *, tp: int, pages: int,
           streams: int, wall_s: float, page: int = PAGE_TOKENS) -> dict:
    """memfit.json from the requests' records (bench.run_request), the memory samples and each
    GPU's (used, total) when the server was ready. Memory lists: one entry per GPU the ranks use."""
    gpus = range(tp)
    peak = [max((s[1][g] for s in samples), default=ready[g][0]) for g in gpus]
    total = [ready[g][1] for g in gpus]
    prompts = [r["prompt_tokens"] for r in recs if r["prompt_tokens"]]
    return {"tp": tp, "pages": pages, "pool_tokens": pages * page, "streams": streams,
            "ok": sum(r["error"] is None for r in recs), "errors": [r["error"] for r in recs if r["error"]][:3],
            "prompt_tokens": sorted(set(prompts)),
            "completion_tokens": sum(r["completion_tokens"] or 0 for r in recs),
            "in_flight_prompt_tokens": sum(prompts),
            "pages_needed": sum(pages_for(r["prompt_tokens"], r["completion_tokens"] or 0, page)
                                for r in recs if r["prompt_tokens"]),
            "wall_s": round(wall_s, 2), "ttft_s": sorted(round(r["t_first"], 3) for r in recs if r["t_first"]),
            "gpu_mib_total": total, "gpu_mib_used_ready": [ready[g][0] for g in gpus], "gpu_mib_used_peak": peak,
            "gpu_mib_headroom": [t - p for t, p in zip(total, peak)], "samples": len(samples)}


def run(out: Path, env: dict, tp: int, streams: int, pages: int, prompt_tokens: int, max_tokens: int,
        model_dir: str, port: int) -> dict:
    import json
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from patchbay.device import servers
    from patchbay.measure import bench

    procs = servers.start_serving(model_dir, tp, port, env, out / "logs", True, pages)
    try:
        url = f"http://127.0.0.1:{port}"
        ready = smi()
        info, chosen = bench.prepare(url, None, ["prefill"], prompt_tokens, cold=True)
        plan = bench.Plan(url=url, model=info["model"], arms={"A": {}, "B": {}}, prompts=chosen, levels=[streams],
                          reps=1, warmup=0, max_tokens=max_tokens, cold=True, timeout=300)
        with Sampler() as sampler:
            t0 = time.perf_counter()
            with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=max(64, streams))) as client, \
                    ThreadPoolExecutor(streams) as pool:
                recs = list(pool.map(lambda _: bench.run_request(client, plan, bench.request_body(plan, chosen[0], "A"),
                                                                 t0), range(streams)))
            wall = time.perf_counter() - t0
        result = report(recs, sampler.samples, ready, tp=tp, pages=pages, streams=streams, wall_s=wall)
        (out / "memfit.json").write_text(json.dumps(result, indent=1))
        return result
    finally:
        for proc in procs:
            servers.stop_server(proc)


def main(argv: list[str] | None = None) -> int:
    import json

    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m patchbay.device memfit", description=__doc__.split("\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--env", default="{}", help="the server's knobs: a JSON object, a knob set (@prod) or @prod+JSON")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--streams", type=int, default=32)
    p.add_argument("--pages", type=int, default=1024, help=f"KV pages of {PAGE_TOKENS} tokens (default: %(default)s)")
    p.add_argument("--prompt-tokens", type=int, default=8100)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--model-dir", default="/tmp/air12", help="a checkpoint (patchbay synth air12 DIR)")
    p.add_argument("--port", type=int, default=8300)
    args = p.parse_args(argv)
    from patchbay.device import gpu

    env = gpu.parse_env(args.env, "--env")
    args.out.mkdir(parents=True, exist_ok=True)
    record.write_command(args.out, "memfit", argv)
    if not fits(args.pages, args.streams, args.prompt_tokens, args.max_tokens):
        print(f"memfit: {args.streams} x {pages_for(args.prompt_tokens, args.max_tokens)} pages exceed the pool's "
              f"{args.pages}: the engine will queue some (measured anyway)", flush=True)
    result = run(args.out, env, args.tp, args.streams, args.pages, args.prompt_tokens, args.max_tokens,
                 args.model_dir, args.port)
    print(json.dumps({k: v for k, v in result.items() if k != "ttft_s"}))
    return 0 if result["ok"] == args.streams else 1


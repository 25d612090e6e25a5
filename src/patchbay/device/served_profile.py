"""Profile a serving process from the outside: where its decode steps go while real requests run.

    python -m patchbay.device served-profile --out DIR ...   (the job: serve, load, profile)
    python -m patchbay.device profiled OUT_DIR -- MODULE [ARGS...]

The job (served_profile_job) starts the server's processes under `profiled`, sends C streams at
each level and signals every rank. `profiled` runs `python -m MODULE ARGS...` (a `transformers
serve` rank, as `servers.start_ranks` starts it) in this interpreter. SIGUSR1 starts torch.profiler, which traces WARM_S seconds unrecorded before
its window (OUT_DIR/started-N appears once the window runs); SIGUSR2 ends the window and writes
OUT_DIR/window-N.json: the GPU kernels of that window by category (collectives included, so a
tensor-parallel rank's all-reduce share shows), the GPU's busy time, and the number of CUDA
graph replays (one per decode step under graphs). The signals only set events; a thread of
its own starts and stops the profiler, which records the device's kernels whichever thread
launched them. The profiler synchronizes the device when a window starts and ends, which a CUDA
graph capture does not survive (W09: it killed the server when a batch of a new size was being
captured), so the engine's captures and the profiler's transitions take turns on one lock.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

GRAPH_LAUNCH = "cudaGraphLaunch"
WARM_S = 1.0  # seconds of tracing before each recorded window
CAPTURE = threading.Lock()  # held while the engine captures a CUDA graph, and while the profiler changes state


def guard_captures() -> bool:
    """Make the engine's CUDA-graph captures hold CAPTURE (False: an engine without them)."""
    try:
        from transformers.generation.continuous_batching.model_runner import ModelRunner
    except ImportError:
        return False
    original = getattr(ModelRunner, "_capture_graph", None)
    if original is None or getattr(original, "pb_guarded", False):
        return original is not None

    @functools.wraps(original)
    def capture(self, *args, **kwargs):
        with CAPTURE:
            return original(self, *args, **kwargs)

    capture.pb_guarded = True
    ModelRunner._capture_graph = capture
    return True


def window_table(prof, seconds: float) -> dict:
    """The profiled window: kernels by category, GPU busy time, graph replays, all per window
    and per replayed step."""
    from .gpu_profile import kernel_table

    replays = sum(1 for event in prof.events() if event.name == GRAPH_LAUNCH)
    table = kernel_table(prof, max(replays, 1))
    table.update(seconds=seconds, graph_replays=replays,
                 wall_ms_per_step=seconds * 1000 / replays if replays else None)
    return table


class Profiler:
    """Start on one event, stop on the other, write each window to OUT_DIR (one thread)."""

    def __init__(self, out: Path):
        self.out = out
        self.start, self.stop = threading.Event(), threading.Event()
        self.windows = 0

    def run(self) -> None:
        import torch

        # The device's kernels and the CUDA runtime calls (graph launches) are all the table
        # needs; the host's torch ops, in every thread of a busy server, are left out.
        cuda = torch.cuda.is_available()
        activities = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
        tables: list[dict] = []
        while True:
            self.start.wait()
            self.start.clear()
            self.stop.clear()
            # A warm-up phase first (tracing on, records dropped), then the recorded window.
            # On the H200 the server ran 2x (C1) to 30x (C32) slower in windows that began
            # when tracing did (W07), whether or not host ops were recorded; the warm-up is
            # meant to take whatever the start of tracing costs out of the window.
            prof = torch.profiler.profile(activities=activities,
                                          schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1),
                                          on_trace_ready=lambda p: tables.append(window_table(p, seconds)))
            with CAPTURE:
                prof.start()
            time.sleep(WARM_S)
            with CAPTURE:
                prof.step()
            t0 = time.perf_counter()
            (self.out / f"started-{self.windows}").touch()  # the driver times its window from here
            self.stop.wait()
            # No device synchronize of our own: a synchronize during a capture breaks it (it took
            # an air24 TP=2 server down at C8 on the H200, W07); the profiler's own waits for
            # any capture in progress. Kernels still running at the stop are left out.
            seconds = time.perf_counter() - t0
            with CAPTURE:
                prof.step()  # the window ends: its records become the table
                prof.stop()
            record = {"pid": os.getpid(), "rank": int(os.environ.get("RANK", "0")), "warm_s": WARM_S,
                      **tables.pop()}
            path = self.out / f"window-{self.windows}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(record, indent=1) + "\n")
            tmp.rename(path)  # a reader never sees half a file
            self.windows += 1


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m patchbay.device profiled OUT_DIR -- MODULE [ARGS...]", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    profiler = Profiler(out)
    guard_captures()
    signal.signal(signal.SIGUSR1, lambda *_: profiler.start.set())
    signal.signal(signal.SIGUSR2, lambda *_: profiler.stop.set())
    threading.Thread(target=profiler.run, name="pb-served-profile", daemon=True).start()
    module, *args = argv[2:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


# ---- the job: serve, load, signal -------------------------------------------------------


COUNT_PROMPT = "Count upwards from 1, one number per line, and do not stop."


class _Started:
    """Set once `total` streams have each received their first token."""

    def __init__(self, total: int):
        self.total, self.seen, self.lock, self.event = total, 0, threading.Lock(), threading.Event()

    def first_token(self) -> None:
        with self.lock:
            self.seen += 1
            if self.seen >= self.total:
                self.event.set()


def stream_prompt(index: int | None) -> str:
    """The streams' prompt: all the same (None), or stream `index`'s own, which on an MoE model
    gives each stream's rows their own experts, as distinct users' requests have."""
    if index is None:
        return COUNT_PROMPT
    return f"Stream {index}: count upwards from {index * 37 + 1}, one number per line, and do not stop."


def stream_reply(url: str, model: str, max_tokens: int, started: _Started, errors: list,
                 index: int | None = None) -> None:
    """One greedy streamed chat reply, read to its end (its prompt: stream_prompt(index))."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": stream_prompt(index)}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    first = True
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
            for line in r.iter_lines():
                if first and line.startswith("data: ") and line != "data: [DONE]":
                    first = False
                    started.first_token()
    except Exception as e:  # reported by the caller, which must not hang on a failed stream
        errors.append(f"{type(e).__name__}: {e}")
        if first:
            started.first_token()


def profile_levels(procs: list, url: str, model: str, levels: list[int], tokens: int, window_s: float,
                   ranks: list[Path], distinct: bool = False) -> list[dict]:
    """For each level: C streams of `tokens` tokens (identical, or each its own prompt with
    `distinct`); once every stream has its first token, each
    served process (started under this module's profiler, writing its windows into ranks[r])
    is profiled for `window_s` seconds."""
    rows = []
    for level in levels:
        started, errors = _Started(level), []
        threads = [threading.Thread(target=stream_reply,
                                    args=(url, model, tokens, started, errors, n if distinct else None))
                   for n in range(level)]
        for t in threads:
            t.start()
        if not started.event.wait(300):
            raise RuntimeError(f"C{level}: not every stream got a first token in 300 s")
        if errors:
            raise RuntimeError(f"C{level}: {errors[0]}")
        before = [len(list(d.glob("window-*.json"))) for d in ranks]
        for proc in procs:
            os.kill(proc.pid, signal.SIGUSR1)
        _wait_for([d / f"started-{n}" for d, n in zip(ranks, before)], f"C{level}: a rank's profiler did not start")
        time.sleep(window_s)
        for proc in procs:
            os.kill(proc.pid, signal.SIGUSR2)
        windows = [d / f"window-{n}.json" for d, n in zip(ranks, before)]
        _wait_for(windows, f"C{level}: a rank wrote no profile window")
        rows += [{"level": level, "rank": rank, **json.loads(path.read_text())} for rank, path in enumerate(windows)]
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"C{level}: {errors[0]}")
    return rows


def _wait_for(paths: list[Path], failure: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.is_file() for p in paths):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{failure} within {timeout:.0f} s")
        time.sleep(0.1)


def render_served(rows: list[dict]) -> str:
    """The profiled windows as a decode-step table (ms a step; a step = one CUDA-graph replay)."""
    from .gpu_profile import STEP_HEADER, step_table_row

    lines = ["| level, rank | wall | GPU busy " + STEP_HEADER, "|---|" + "---:|" * 10]
    for row in rows:
        label = f"C{row['level']}, rank {row['rank']}"
        if row.get("wall_ms_per_step") is None:
            lines.append(f"| {label} | no CUDA-graph replays in the window (no GPU, or graphs off) |" + " |" * 9)
        else:
            lines.append(step_table_row(label, row))
    return "\n".join(lines) + "\n"


def served_profile_job(out: Path, levels: list[int], tokens: int, window_s: float, env: dict, cuda_graphs: bool,
                       num_blocks: int, model_dir: str | None, tp: int, port: int, device: str = "cuda",
                       distinct: bool = False) -> int:
    """Serve (air12 in memory, or MODEL_DIR as `tp` ranks), profile each level's decode steps on
    every rank, write out/served-profile.json and out/table.md."""
    from .servers import AIR12, start_serving, with_servers

    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def job(procs: list) -> int:
        procs += start_serving(model_dir, tp, port, env, out / "server", cuda_graphs, num_blocks, device,
                               profile_dir=out)
        ranks = [out / f"rank{r}" for r in range(len(procs))]
        rows.extend(profile_levels(procs, f"http://127.0.0.1:{port}", model_dir or AIR12, levels, tokens, window_s,
                                   ranks))
        return 0

    if with_servers(job):
        return 1
    (out / "served-profile.json").write_text(json.dumps({"levels": levels, "tokens": tokens, "window_s": window_s,
                                                         "distinct_prompts": distinct, "env": env, "tp": tp,
                                                         "rows": rows}, indent=1) + "\n")
    table = render_served(rows)
    (out / "table.md").write_text(table)
    print(table, flush=True)
    return 0

"""Profile a serving process from the outside: where its decode steps go while real requests run.

    python -m patchbay.served_profile OUT_DIR -- MODULE [ARGS...]

runs `python -m MODULE ARGS...` (a `transformers serve` rank, as `gpu.start_ranks` starts it) in
this interpreter. SIGUSR1 starts torch.profiler, which traces WARM_S seconds unrecorded before
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
        print("usage: python -m patchbay.served_profile OUT_DIR -- MODULE [ARGS...]", file=sys.stderr)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

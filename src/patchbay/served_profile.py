"""Profile a serving process from the outside: where its decode steps go while real requests run.

    python -m patchbay.served_profile OUT_DIR -- MODULE [ARGS...]

runs `python -m MODULE ARGS...` (a `transformers serve` rank, as `gpu.start_ranks` starts it) in
this interpreter. SIGUSR1 starts torch.profiler (OUT_DIR/started-N appears once it runs),
SIGUSR2 stops it and writes OUT_DIR/window-N.json: the GPU kernels of that window by category (collectives included, so a
tensor-parallel rank's all-reduce share shows), the GPU's busy time, and the number of CUDA
graph replays (one per decode step under graphs). The signals only set events; a thread of
its own starts and stops the profiler, which records the device's kernels whichever thread
launched them.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
import time
from pathlib import Path

GRAPH_LAUNCH = "cudaGraphLaunch"


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

        # The device's kernels and the CUDA runtime calls (graph launches) only: recording the
        # host's torch ops too, in every thread of a busy server, slowed the engine 2x at C1
        # and 30x at C32 on the H200 (W07), which made the windows measure the profiler.
        cuda = torch.cuda.is_available()
        activities = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
        while True:
            self.start.wait()
            self.start.clear()
            self.stop.clear()
            prof = torch.profiler.profile(activities=activities)
            prof.start()
            t0 = time.perf_counter()
            (self.out / f"started-{self.windows}").touch()  # the driver times its window from here
            self.stop.wait()
            # No device synchronize here: the engine may be capturing a CUDA graph for a new
            # batch size right now, and a synchronize during a capture breaks it (it took an
            # air24 TP=2 server down at C8 on the H200, W07). Kernels still running at the
            # stop are left out of the window.
            seconds = time.perf_counter() - t0
            prof.stop()
            record = {"pid": os.getpid(), "rank": int(os.environ.get("RANK", "0")), **window_table(prof, seconds)}
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
    signal.signal(signal.SIGUSR1, lambda *_: profiler.start.set())
    signal.signal(signal.SIGUSR2, lambda *_: profiler.stop.set())
    threading.Thread(target=profiler.run, name="pb-served-profile", daemon=True).start()
    module, *args = argv[2:]
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

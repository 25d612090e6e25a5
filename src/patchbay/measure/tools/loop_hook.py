"""Where a decode step's host time goes: the wall time of each batching-loop body, then cProfile
over a range of bodies, per process. Runs as a sitecustomize hook in the server:

    HOSTPROF2_DIR=DIR [HOSTPROF2_FROM=300] [HOSTPROF2_TO=900] \
        PYTHONPATH=$(python -m patchbay.measure.tools.hooks site):$PYTHONPATH python3 -m patchbay.device serve ...

Bodies before FROM: their start (perf_counter s) and wall ms in DIR/walls-PID.txt; bodies FROM..TO
run under cProfile, dumped to DIR/loop-PID.prof when body TO ends (`python -m pstats`). Both files
are written then, once. The loop's own CPU work per step (cProfile's totals less the event waits,
`synchronize`) against the step period says whether the GPU waits on the host.
Replaces W10's tp1-decode-host-profile/loop_hook.py.
"""

from __future__ import annotations

import os
import sys
import time

from patchbay.measure.tools import hooks

MODULE = "transformers.generation.continuous_batching.continuous_api"
BODY = "ContinuousBatchingManager._generation_loop_body"


def install(folder: str, first: int = 300, last: int = 900, module: str = MODULE, body: str = BODY) -> None:
    hooks.after_import(module, lambda m: _patch(m, body, folder, first, last))


def install_from_env(environ=os.environ) -> bool:
    folder = environ.get("HOSTPROF2_DIR")
    if not folder:
        return False
    install(folder, int(environ.get("HOSTPROF2_FROM", "300")), int(environ.get("HOSTPROF2_TO", "900")))
    return True


def _patch(module, body: str, folder: str, first: int, last: int) -> None:
    import cProfile

    found = hooks.resolve(module, body)
    if found is None:
        hooks.warn(f"loop_hook: {module.__name__}.{body} not found")
        return
    owner, attr, raw = found
    state = {"n": 0, "profile": cProfile.Profile(), "walls": []}

    def wrapped(self, *args, **kwargs):
        n = state["n"]
        state["n"] += 1
        t0 = time.perf_counter()
        try:
            if first <= n < last:
                state["profile"].enable()
                try:
                    return raw(self, *args, **kwargs)
                finally:
                    state["profile"].disable()
            return raw(self, *args, **kwargs)
        finally:
            if n < first:
                state["walls"].append((t0, time.perf_counter() - t0))
            elif n == last:
                _write(folder, state)

    setattr(owner, attr, wrapped)


def _write(folder: str, state: dict) -> None:
    os.makedirs(folder, exist_ok=True)
    tag = os.getpid()
    state["profile"].dump_stats(os.path.join(folder, f"loop-{tag}.prof"))
    with open(os.path.join(folder, f"walls-{tag}.txt"), "w") as f:
        for start, wall in state["walls"]:
            f.write(f"{start:.6f} {wall * 1000:.4f}\n")


if __name__ == "__main__":
    print(__doc__, file=sys.stderr)
    sys.exit(2)

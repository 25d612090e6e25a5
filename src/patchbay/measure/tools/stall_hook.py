"""What stalls a pass's first tokens: every Triton compile (or cache load), every CUDA-graph capture
and every "Request received" / capture / warm-up log line, on the monotonic clock (the one
patchbay.bench's epoch uses), one TSV per process. Runs as a sitecustomize hook in every process:

    STALLPROF_DIR=DIR PYTHONPATH=$(python -m patchbay.measure.tools.hooks site):$PYTHONPATH ...

DIR/ev-PID-rRANK.tsv (RANK from RANK or PB_RANK, `x` when neither is set) has lines
`start  duration  kind  name`: kind `start` (name: the command line), `log`, `triton`
(name: the kernel and its launch key), `graph` (a capture, begin to end), `hookerror`.
stalls.py sets them against a window's passes. Replaces W15's compile-stalls-tp2-api/stall_hook.py.
"""

from __future__ import annotations

import os
import sys
import time

from patchbay.measure.tools import hooks

def events_path(folder: str, environ=os.environ) -> str:
    rank = environ.get("RANK", environ.get("PB_RANK", "x"))
    return os.path.join(folder, f"ev-{os.getpid()}-r{rank}.tsv")


def install(folder: str, environ=os.environ) -> hooks.Log:
    log = hooks.Log(events_path(folder, environ))

    def emit(kind, name, t0, t1):
        log.write(f"{t0:.6f}", f"{t1 - t0:.6f}", kind, name)

    now = time.perf_counter()
    emit("start", " ".join(sys.argv)[:200], now, now)
    _watch_logging(emit)
    hooks.after_import("triton.runtime.jit", lambda jit: _guarded(emit, _patch_triton, jit))
    hooks.after_import("torch.cuda.graphs", lambda graphs: _guarded(emit, _patch_graphs, graphs))
    return log


def install_from_env(environ=os.environ) -> bool:
    folder = environ.get("STALLPROF_DIR")
    if not folder:
        return False
    install(folder, environ)
    return True


def _guarded(emit, patch, module) -> None:
    try:
        patch(emit, module)
    except Exception as e:  # noqa: BLE001  (a diagnostic must not take the server down)
        now = time.perf_counter()
        emit("hookerror", repr(e)[:150], now, now)


def _watch_logging(emit) -> None:
    import logging

    previous = logging.getLogRecordFactory()

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        try:
            message = str(record.msg)
            if "Request received" in message or "apture" in message or "warmup" in message.lower():
                now = time.perf_counter()
                emit("log", message[:120], now, now)
        except Exception:  # noqa: BLE001
            pass
        return record

    logging.setLogRecordFactory(factory)


def _patch_triton(emit, jit) -> None:
    cls = jit.JITFunction
    compile_ = cls.__dict__.get("_do_compile")
    if compile_ is None or getattr(compile_, "_pb_measure", False):
        if compile_ is None:
            raise AttributeError("triton's JITFunction has no _do_compile")
        return

    def _do_compile(self, key, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return compile_(self, key, *args, **kwargs)
        finally:
            emit("triton", f"{getattr(self, '__name__', '?')} {str(key)[:160]}", t0, time.perf_counter())
    _do_compile._pb_measure = True
    cls._do_compile = _do_compile


def span(cls, begin: str, end: str, emit, kind: str, name: str) -> None:
    """Time cls's begin(...) … end(...) pairs per instance, as one `kind` event each."""
    raw_begin, raw_end = getattr(cls, begin), getattr(cls, end)
    if getattr(raw_begin, "_pb_measure", False):
        return
    started: dict[int, float] = {}

    def on_begin(self, *args, **kwargs):
        started[id(self)] = time.perf_counter()
        return raw_begin(self, *args, **kwargs)

    def on_end(self, *args, **kwargs):
        result = raw_end(self, *args, **kwargs)
        t0 = started.pop(id(self), None)
        now = time.perf_counter()
        emit(kind, name, now if t0 is None else t0, now)
        return result
    on_begin._pb_measure = on_end._pb_measure = True
    setattr(cls, begin, on_begin)
    setattr(cls, end, on_end)


def _patch_graphs(emit, graphs) -> None:
    span(graphs.CUDAGraph, "capture_begin", "capture_end", emit, "graph", "capture")


if __name__ == "__main__":
    print(__doc__, file=sys.stderr)
    sys.exit(2)

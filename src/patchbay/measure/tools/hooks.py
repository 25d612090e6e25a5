"""What the engine-side hooks share: patching a module when it is imported, wrapping a function with
a timer, and one line-buffered log per process.

The hooks (timing_hook, stall_hook, loop_hook) run inside a server process, installed at
interpreter start by site/sitecustomize.py, so this module keeps to the standard library. A hook
must never take the server down: what cannot be patched is reported on stderr (the server log) and
left alone.

    python -m patchbay.measure.tools.hooks site     prints the folder to put first on PYTHONPATH
"""

from __future__ import annotations

import functools
import importlib.abc
import inspect
import sys
import threading
import time
from pathlib import Path

SITE = Path(__file__).resolve().parent / "site"
_pending: dict[str, list] = {}
_finder: _AfterImport | None = None
_lock = threading.Lock()


def warn(message: str) -> None:
    print(f"patchbay.measure: {message}", file=sys.stderr, flush=True)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds a pending module's spec with the finders after it, then runs the module's hooks right
    after the module's own code."""

    def find_spec(self, name, path, target=None):
        if name not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        with _lock:
            hooks = _pending.pop(name, [])
        run = spec.loader.exec_module

        def exec_module(module, run=run):
            run(module)
            if module.__name__ != name:  # a loader shared by several modules (a zip importer)
                return
            for hook in hooks:
                try:
                    hook(module)
                except Exception as e:  # noqa: BLE001  (a diagnostic must not stop the import)
                    warn(f"a hook on {name} failed: {type(e).__name__}: {e}")

        spec.loader.exec_module = exec_module
        return spec


def after_import(name: str, hook) -> None:
    """Run hook(module) once module `name` has run its code; at once if it already has."""
    global _finder
    module = sys.modules.get(name)
    if module is not None:
        hook(module)
        return
    with _lock:
        _pending.setdefault(name, []).append(hook)
        if _finder is None:
            _finder = _AfterImport()
            sys.meta_path.insert(0, _finder)


def resolve(module, qualname: str):
    """(owner, attribute, the raw object) for `Class.method` or `function` in module; None when
    the module no longer has it. The raw object comes from the class's own __dict__, so a
    staticmethod stays recognisable and an inherited method is not patched on the subclass."""
    *path, attr = qualname.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part, None)
        if owner is None:
            return None
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
    return None if raw is None else (owner, attr, raw)


def timed(fn, done):
    """fn wrapped to call done(wall_s, thread_cpu_s, depth) after every call. depth: how many timed
    calls enclose this one on its thread. A coroutine function gets its wall time only (its CPU
    time is spread over the event loop: NaN); async generators, properties, static and class
    methods come back unwrapped (None), which the caller reports."""
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def wrapped_async(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return await fn(*args, **kwargs)
            finally:
                done(time.perf_counter() - t0, float("nan"), _depth())
        return wrapped_async
    if inspect.isasyncgenfunction(fn) or isinstance(fn, (staticmethod, classmethod, property)) or not callable(fn):
        return None

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        t0, c0 = time.perf_counter(), time.thread_time()
        _stack.depth = _depth() + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _stack.depth -= 1
            done(time.perf_counter() - t0, time.thread_time() - c0, _stack.depth)
    return wrapped


_stack = threading.local()


def _depth() -> int:
    return getattr(_stack, "depth", 0)


class Log:
    """One file of tab-separated lines, appended to from any thread."""

    def __init__(self, path: str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def write(self, *fields) -> None:
        line = "\t".join(str(f).replace("\t", " ").replace("\n", " ") for f in fields) + "\n"
        with self._lock:
            self._file.write(line)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["site"]:
        print("usage: python -m patchbay.measure.tools.hooks site", file=sys.stderr)
        return 2
    print(SITE)
    return 0


if __name__ == "__main__":
    sys.exit(main())

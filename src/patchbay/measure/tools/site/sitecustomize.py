"""patchbay's measurement hooks, installed at interpreter start in every process that has this
folder first on PYTHONPATH (`python -m patchbay.measure.tools.hooks site` prints it). Each hook is
off unless its variable is set:

    HOSTPROF_LOG=FILE    patchbay.measure.tools.timing_hook  (calls' wall and CPU time)
    STALLPROF_DIR=DIR    patchbay.measure.tools.stall_hook   (Triton compiles, graph captures)
    HOSTPROF2_DIR=DIR    patchbay.measure.tools.loop_hook    (batching-loop bodies, cProfile)

Each records its settings, the process and the engine build in command.txt beside its output.
Another sitecustomize later on sys.path (the system's) still runs. Nothing here may stop the
process: a hook that fails to install says so on stderr.
"""

import os
import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_HOOKS = (("HOSTPROF_LOG", "timing_hook", ("HOSTPROF_RECORD", "HOSTPROF_TARGETS", "HOSTPROF_OPS_INSIDE")),
          ("STALLPROF_DIR", "stall_hook", ()),
          ("HOSTPROF2_DIR", "loop_hook", ("HOSTPROF2_FROM", "HOSTPROF2_TO")))


def _install() -> None:
    wanted = [hook for hook in _HOOKS if os.environ.get(hook[0])]
    if not wanted:
        return
    try:
        import patchbay  # noqa: F401
    except ImportError:  # src/ not on the path: it is this folder's fourth parent
        sys.path.append(str(_HERE.parents[3]))
    import importlib

    from patchbay.measure.tools import record

    for variable, tool, extra in wanted:
        try:
            module = importlib.import_module(f"patchbay.measure.tools.{tool}")
            module.install_from_env(os.environ)
            value = os.environ[variable]
            folder = Path(value).parent if variable == "HOSTPROF_LOG" else Path(value)
            env = {k: os.environ[k] for k in (variable, *extra) if k in os.environ}
            record.append_line(folder, record.hook_line(tool, env, [Path(sys.executable).name, *sys.argv]))
        except Exception as e:  # noqa: BLE001
            print(f"patchbay.measure: {tool} not installed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _chain() -> None:
    """Run the next sitecustomize on sys.path, the one this file hides."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None and Path(spec.origin).resolve() != Path(__file__).resolve():
        try:
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
        except Exception as e:  # noqa: BLE001
            print(f"patchbay.measure: {spec.origin}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


_install()
_chain()

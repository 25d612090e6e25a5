"""Running a snippet in a fresh interpreter with patchbay's hook site first on PYTHONPATH (the hooks
patch torch, triton and logging process-wide, so they are not installed into the test process)."""

import os
import subprocess
import sys
from pathlib import Path

from patchbay import ROOT
from patchbay.measure.tools import hooks


def run_with_hooks(code: str, cwd: Path, *paths: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("HOSTPROF_LOG", "STALLPROF_DIR", "HOSTPROF2_DIR", "PYTHONPATH")}
    pythonpath = os.pathsep.join([str(hooks.SITE), *map(str, paths), str(ROOT / "src")])
    script = cwd / "job.py"  # a file, not -c: Triton reads a kernel's source
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**base, "PYTHONPATH": pythonpath, **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc

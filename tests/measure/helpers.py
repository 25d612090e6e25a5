"""Running a snippet in a fresh interpreter with patchbay's hook site first on PYTHONPATH (the hooks
patch torch, triton and logging process-wide, so they are not installed into the test process);
what a window's plot must be."""

import os
import subprocess
import sys
from pathlib import Path

from PIL import Image

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


def is_png(path) -> bool:
    """A palette PNG (plots.save) that is not one colour: a plot was drawn."""
    if not (path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"):
        return False
    with Image.open(path) as picture:
        return picture.mode == "P" and 2 < len(picture.getcolors(256) or []) <= 64

"""Patched tree -> wheel -> engine folder.

The series' hooks are applied onto a throwaway copy of the pinned source and the overlay
(engine/) is mirrored into its package, the knob registry is
generated from the patch headers into transformers/_pb/build_info.py, and a wheel versioned
`<upstream>+pb.<build id>` is built. Each build is installed into build/engines/<id>/,
a folder put first on PYTHONPATH by whoever runs that engine, so the pristine engine and
any number of patched builds live side by side in one virtual environment.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import ROOT
from .knobs import registry_json
from .series import Series, scratch_copy
from .upstream import LOCK_PATH, Lock, ensure

BUILD_DIR = ROOT / "build"


class BuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class Engine:
    build_id: str  # "pb-<12 hex>" for a patched build, "upstream-<version>" for the pristine one
    wheel: Path
    site: Path  # put this first on PYTHONPATH to run this engine

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": str(self.site)}


def build_info(series: Series, lock: Lock, build_id: str) -> str:
    knobs = json.loads(registry_json(series.knobs()))["knobs"]
    return json.dumps({"build_id": build_id, "upstream": f"{lock.name} {lock.version}",
                       "patches": [p.name for p in series.patches], "knobs": knobs},
                      indent=2, sort_keys=True) + "\n"


def _set_version(tree: Path, version: str) -> None:
    setup = tree / "setup.py"
    text, n = re.subn(r'version="[^"]+"', f'version="{version}"', setup.read_text(), count=1)
    if n != 1:
        raise BuildError(f"{setup}: found no version= to stamp")
    setup.write_text(text)


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise BuildError(f"{what} failed:\n{tail}")


def build(series: Series | None, *, lock_path: Path = LOCK_PATH, upstream_dir: Path | None = None,
          out: Path = BUILD_DIR, progress=print) -> Engine:
    """Build (or reuse) the engine for series; None builds the pristine upstream engine."""
    lock = Lock.read(lock_path)
    upstream_dir = ensure(lock, progress=progress) if upstream_dir is None else upstream_dir
    if series is None:
        build_id, version = f"upstream-{lock.version}", lock.version
    else:
        build_id = "pb-" + series.build_id(lock_path)
        version = f"{lock.version}+pb.{build_id[3:]}"
    site = out / "engines" / build_id
    wheels = out / "wheels"
    wheel_name = f"{lock.name}-{version}-py3-none-any.whl"
    if (site / ".complete").is_file() and (wheels / wheel_name).is_file():
        return Engine(build_id, wheels / wheel_name, site)

    wheels.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        tree = scratch_copy(upstream_dir, Path(tmp) / "tree", lock.ref_tag)
        if series is not None:
            progress(f"applying {len(series.patches)} patches onto {lock.name} {lock.version}")
            series.apply_to(tree, lock.src_path)
            pb = tree / lock.src_path / "_pb"
            if pb.is_dir():  # a module, not a data file, so the wheel always carries it
                (pb / "build_info.py").write_text(
                    '"""Written by patchbay\'s build from the patch headers; do not edit."""\n\n'
                    f"BUILD_JSON = r'''{build_info(series, lock, build_id)}'''\n")
        _set_version(tree, version)
        progress(f"building {wheel_name}")
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
              "-w", str(wheels), str(tree)], "building the wheel")
    if not (wheels / wheel_name).is_file():
        raise BuildError(f"the wheel build did not produce {wheel_name}")
    shutil.rmtree(site, ignore_errors=True)
    progress(f"installing into {site.relative_to(out.parent) if out.parent in site.parents else site}")
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site),
          str(wheels / wheel_name)], "installing the wheel")
    (site / ".complete").write_text(build_id + "\n")
    return Engine(build_id, wheels / wheel_name, site)

"""The overlay: the engine code the patches' hooks call, as ordinary files under engine/.

engine/X is mirrored to <package>/X of the patched tree (engine/_pb/... -> transformers/_pb/...)
after the hooks apply; which patch brings or changes each file is its header's Modules field
(checked in series.py).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .. import ROOT

OVERLAY_DIR = ROOT / "engine"
# Generated into the overlay's place at build, never tracked.
GENERATED = ("_pb/build_info.py",)


def overlay_files(overlay: Path) -> list[str]:
    """The overlay's files, relative to it, sorted; caches and generated files left out."""
    if not overlay.is_dir():
        return []
    return sorted(str(f.relative_to(overlay)) for f in overlay.rglob("*")
                  if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"
                  and str(f.relative_to(overlay)) not in GENERATED)


def copy_overlay(overlay: Path, target: Path) -> list[str]:
    """Mirror the overlay's files into target (the package folder of a patched tree)."""
    files = overlay_files(overlay)
    for rel in files:
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(overlay / rel, target / rel)
    return files

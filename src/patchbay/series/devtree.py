"""A working tree for changing patches: the series as one commit per patch, and back.

`patchbay dev` clones the pristine source into build/dev, commits the overlay (engine/,
mirrored into the package) first, then each patch's hooks on top (the commit subject is the
patch file name). Edit, amend or add commits there, then `patchbay export` rewrites each
patch's diff from its commit, keeping its header, and copies the overlay files changed in
the dev tree back into engine/. The overlay can as well be edited in engine/ directly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .. import ROOT
from .gitutil import git
from .overlay import GENERATED, copy_overlay, overlay_files
from .series import (Problem, Series, SeriesError, scratch_copy, split_patch,
                     try_apply)

DEV_DIR = ROOT / "build" / "dev"
OVERLAY_SUBJECT = "overlay: engine/ mirrored into the package"


def create(series: Series, upstream_dir: Path, ref: str, dest: Path = DEV_DIR, force: bool = False,
           src_path: str = "src/transformers") -> Path:
    if dest.exists():
        dirty = git(["status", "--porcelain"], dest, check=False).stdout.strip() if (dest / ".git").exists() else "?"
        if not force:
            raise SeriesError([Problem("series", f"{dest} exists; export your work first, then "
                                                 "run `patchbay dev --force` to recreate it")])
        if dirty:
            raise SeriesError([Problem("series", f"{dest} has uncommitted changes; commit or drop them first")])
        shutil.rmtree(dest)
    scratch_copy(upstream_dir, dest, ref)
    git(["checkout", "-q", "-b", "series"], dest)
    if series.overlay:
        copy_overlay(series.overlay, dest / src_path)
        git(["add", "-A", "-f", "."], dest)
        git(["commit", "-q", "-m", OVERLAY_SUBJECT], dest)
    for patch in series.patches:
        outcome, detail = try_apply(patch, dest)
        if outcome != "applied":
            raise SeriesError([Problem(patch.path.name, f"{outcome}: {detail}")])
        git(["add", "-A", "-f", "."], dest)
        git(["commit", "-q", "--allow-empty", "-m", patch.path.name], dest)
    return dest


def export(series: Series, ref: str, dev: Path = DEV_DIR, src_path: str = "src/transformers") -> list[str]:
    """Rewrite patches from the dev tree's commits and the overlay from its last state.
    Returns the names of changed files (patches/... and engine/...)."""
    commits = git(["rev-list", "--reverse", f"{ref}..HEAD"], dev).stdout.split()
    by_name = {p.path.name: p for p in series.patches}
    overlay_paths = _overlay_paths(series, dev, src_path)
    changed = []
    for commit in commits:
        subject = git(["log", "-1", "--format=%s", commit], dev).stdout.strip()
        if subject == OVERLAY_SUBJECT:
            continue
        patch = by_name.get(subject)
        if patch is None:
            raise SeriesError([Problem(subject, f"commit {commit[:10]} has no patch file of that name; create "
                                                "patches/NNNN-slug.patch with a header, list it in "
                                                "patches/series, and use its file name as the commit subject")])
        excluded = [f":(exclude){p}" for p in overlay_paths]
        diff = git(["diff", "--full-index", "--no-color", "--no-ext-diff", f"{commit}~1", commit, "--", ".",
                    *excluded], dev).stdout
        header, _ = split_patch(patch.path.read_text())
        text = "\n".join(header) + "\n---\n" + diff
        if text != patch.path.read_text():
            patch.path.write_text(text)
            changed.append(f"patches/{patch.path.name}")
    if series.overlay:
        changed += _export_overlay(series.overlay, dev / src_path, overlay_paths)
    return changed


def _overlay_paths(series: Series, dev: Path, src_path: str) -> list[str]:
    """The overlay's folders as paths in the dev tree (its top-level entries, e.g. src/transformers/_pb)."""
    if not series.overlay:
        return []
    return sorted({f"{src_path}/{rel.split('/')[0]}" for rel in series.overlay_files()})


def _export_overlay(overlay: Path, package: Path, overlay_paths: list[str]) -> list[str]:
    """Copy the dev tree's overlay files that differ (or are new) back into engine/; drop the
    ones the dev tree removed."""
    tops = [p.rsplit("/", 1)[-1] for p in overlay_paths]
    here = {f"{top}/{rel}" for top in tops for rel in overlay_files(package / top)} - set(GENERATED)
    changed = []
    for rel in sorted(here):
        src, dst = package / rel, overlay / rel
        if not dst.is_file() or dst.read_bytes() != src.read_bytes():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            changed.append(f"engine/{rel}")
    for rel in sorted(set(overlay_files(overlay)) - here):
        (overlay / rel).unlink()
        changed.append(f"engine/{rel} (removed)")
    return changed

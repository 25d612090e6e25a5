"""A working tree for changing patches: the series as one commit per patch, and back.

`patchbay dev` clones the pristine source into build/dev and commits each patch on top
(the commit subject is the patch file name). Edit, amend or add commits there, then
`patchbay export` rewrites each patch's diff from its commit, keeping its header.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from . import ROOT
from .gitutil import git
from .series import Problem, Series, SeriesError, scratch_copy, split_patch, try_apply

DEV_DIR = ROOT / "build" / "dev"


def create(series: Series, upstream_dir: Path, ref: str, dest: Path = DEV_DIR, force: bool = False) -> Path:
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
    for patch in series.patches:
        outcome, detail = try_apply(patch, dest)
        if outcome != "applied":
            raise SeriesError([Problem(patch.path.name, f"{outcome}: {detail}")])
        git(["add", "-A", "-f", "."], dest)
        git(["commit", "-q", "-m", patch.path.name], dest)
    return dest


def export(series: Series, ref: str, dev: Path = DEV_DIR) -> list[str]:
    """Rewrite patches from the dev tree's commits. Returns the names of changed files."""
    commits = git(["rev-list", "--reverse", f"{ref}..HEAD"], dev).stdout.split()
    by_name = {p.path.name: p for p in series.patches}
    changed = []
    for commit in commits:
        subject = git(["log", "-1", "--format=%s", commit], dev).stdout.strip()
        patch = by_name.get(subject)
        if patch is None:
            raise SeriesError([Problem(subject, f"commit {commit[:10]} has no patch file of that name; create "
                                                "patches/NNNN-slug.patch with a header, list it in "
                                                "patches/series, and use its file name as the commit subject")])
        diff = git(["diff", "--full-index", "--no-color", "--no-ext-diff", f"{commit}~1", commit], dev).stdout
        header, _ = split_patch(patch.path.read_text())
        text = "\n".join(header) + "\n---\n" + diff
        if text != patch.path.read_text():
            patch.path.write_text(text)
            changed.append(patch.path.name)
    return changed

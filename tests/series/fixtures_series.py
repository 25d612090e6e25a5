"""Builders for fixture upstreams, sdists and patch series (plain functions, no pytest magic).

Fixture modules have numbered, all-distinct lines (`A_LINE_07 = 7`), so a test can name the
exact line a patch or a new release changes and reason about hunks and context.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path

from patchbay.series.gitutil import commit_all, git, init_repo
from patchbay.series.series import scratch_copy

PKG = "src/fixturepkg"

HEADER = {
    "Description": "Fixture patch.",
    "Knob": "none",
    "Per-Request": "no",
    "Status": "infrastructure",
    "Exactness": "same-bits",
    "Gain": "none measured",
    "Depends": "none",
    "Modules": "none",
    "Upstream-Status": "Pending",
    "Last-Update": "2026-01-01",
}


def module(name: str, lines: int = 30) -> str:
    return "".join(f"{name.upper()}_LINE_{i:02d} = {i}\n" for i in range(1, lines + 1))


def with_line(text: str, number: int, new: str) -> str:
    """text with its 1-based line `number` replaced by `new`."""
    lines = text.splitlines(keepends=True)
    lines[number - 1] = new + "\n"
    return "".join(lines)


def base_files(modules: tuple[str, ...] = ("a", "b", "c")) -> dict[str, str]:
    files = {"PKG-INFO": "Name: fixturepkg\n", f"{PKG}/__init__.py": '"""Fixture package."""\n'}
    files.update({f"{PKG}/{m}.py": module(m) for m in modules})
    return files


def write_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def make_upstream(path: Path, files: dict[str, str], tag: str = "v1.0") -> str:
    """A one-commit fixture upstream repo, tagged. Returns the commit."""
    write_tree(path, files)
    init_repo(path)
    commit = commit_all(path, "fixture upstream")
    git(["tag", tag], path)
    return commit


def make_sdist(path: Path, top: str, files: dict[str, str]) -> Path:
    """A real .tar.gz with the single top folder `top/`, as PyPI sdists have."""
    with tarfile.open(path, "w:gz") as tar:
        for rel, text in sorted(files.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size, info.mode, info.mtime = len(data), 0o644, 946684800
            tar.addfile(info, io.BytesIO(data))
    return path


def diff_for(upstream_dir: Path, changes: dict[str, str | None], ref: str = "HEAD",
             reverse: bool = False) -> str:
    """The `git diff` that turns upstream_dir@ref into the tree with `changes` (path -> new
    text, None deletes). reverse=True gives the diff from the changed tree back to upstream."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = scratch_copy(upstream_dir, Path(tmp) / "tree", ref)
        for rel, text in changes.items():
            if text is None:
                (tree / rel).unlink()
            else:
                write_tree(tree, {rel: text})
        git(["add", "-A", "."], tree)
        args = ["diff", "--cached", "--full-index", "--no-color", "--no-ext-diff"] + (["-R"] if reverse else [])
        return git(args, tree).stdout


def patch_text(diff: str, **fields: str | None) -> str:
    """A patch file: the default header with `fields` changed (None drops a field; a name not
    in the defaults is appended, underscores standing for dashes), `---`, then the diff."""
    header = dict(HEADER)
    for key, value in fields.items():
        header[key.replace("_", "-")] = value
    lines = []
    for key, value in header.items():
        if value is None:
            continue
        first, *rest = value.split("\n")
        lines.append(f"{key}: {first}")
        lines += [f" {line}" for line in rest]
    return "\n".join(lines) + "\n---\n" + diff


def write_series(series_dir: Path, patches: dict[str, str], order: list[str] | None = None) -> Path:
    """patches: file name -> full text. order: the series file's lines (default: the dict's order)."""
    series_dir.mkdir(parents=True, exist_ok=True)
    for name, text in patches.items():
        (series_dir / name).write_text(text)
    listing = order if order is not None else list(patches)
    (series_dir / "series").write_text("# fixture series\n" + "".join(f"{n}\n" for n in listing))
    return series_dir

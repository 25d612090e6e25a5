"""The patch series: parse headers, validate everything a series can get wrong, apply it.

patches/series lists the patches in order (`#` comments allowed). Each NNNN-slug.patch
starts with a DEP-3 style header, a line `---`, then a `git diff` against upstream: the thin
hooks in upstream's files. The engine code the hooks call is the overlay, ordinary files
under engine/ (engine/_pb/... becomes <package>/_pb/... in the patched tree); each patch's
`Modules` field names the overlay files it brings or changes, and every overlay file is
named by some patch.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import ROOT
from .gitutil import git
from .knobs import Knob, KnobError, parse_declaration
from .overlay import copy_overlay, overlay_files

SERIES_DIR = ROOT / "patches"
FIELDS = ("Description", "Knob", "Per-Request", "Status", "Exactness", "Gain", "Depends",
          "Modules", "Upstream-Status", "Last-Update")
STATUSES = ("infrastructure", "adopted", "opt-in", "rejected")
UPSTREAM_STATUSES = ("Pending", "Submitted", "Backport", "Inappropriate")
FILE_RE = re.compile(r"^(\d{4})-([a-z0-9][a-z0-9-]*)\.patch$")
HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class SeriesError(RuntimeError):
    """Raised when a series cannot be used; carries every problem found."""

    def __init__(self, problems: list["Problem"], hint: str = ""):
        self.problems = problems
        super().__init__("\n".join([*(str(p) for p in problems), *([hint] if hint else [])]))


@dataclass(frozen=True)
class Problem:
    where: str  # a patch file name, or "series"
    message: str

    def __str__(self) -> str:
        return f"patches/{self.where}: {self.message}"


@dataclass(frozen=True)
class Patch:
    path: Path
    number: int
    slug: str
    fields: dict = field(compare=False)
    diff: str = field(compare=False)
    knob: Knob | None = None
    depends: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()  # overlay files (relative to engine/) this patch brings or changes

    @property
    def name(self) -> str:
        return self.path.stem

    @property
    def status(self) -> str:
        return self.fields.get("Status", "")

    @property
    def has_hooks(self) -> bool:
        """Whether the patch changes upstream's files (a patch of engine code alone does not)."""
        return bool(self.diff.strip())

    def files(self) -> list[str]:
        return [m.group(1) for m in re.finditer(r"^diff --git a/(\S+) b/", self.diff, re.M)]


@dataclass
class Series:
    dir: Path
    patches: list[Patch]
    overlay: Path | None = None  # engine/ beside patches/; None: the series has no overlay

    def knobs(self) -> list[Knob]:
        return [p.knob for p in self.patches if p.knob is not None]

    def overlay_files(self) -> list[str]:
        return overlay_files(self.overlay) if self.overlay else []

    def digest(self, lock_path: Path) -> str:
        """sha256 over the lock, every patch's bytes in series order, and every overlay file."""
        h = hashlib.sha256(lock_path.read_bytes())
        for p in self.patches:
            h.update(b"\0" + p.path.name.encode() + b"\0" + p.path.read_bytes())
        for rel in self.overlay_files():
            h.update(b"\0overlay\0" + rel.encode() + b"\0" + (self.overlay / rel).read_bytes())
        return h.hexdigest()

    def apply_to(self, tree: Path, src_path: str) -> None:
        """The whole series onto a pristine tree: every patch's hooks in order, then the overlay."""
        apply_series(self, tree)
        if self.overlay:
            copy_overlay(self.overlay, tree / src_path)

    def build_id(self, lock_path: Path) -> str:
        return self.digest(lock_path)[:12]


def split_patch(text: str) -> tuple[list[str], str]:
    """Header lines and the diff that follows the `---` separator."""
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.rstrip("\n") == "---":
            return [l.rstrip("\n") for l in lines[:i]], "".join(lines[i + 1:])
    return [l.rstrip("\n") for l in lines], ""


def parse_header(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """DEP-3 fields: `Name: value`, continuation lines start with a space."""
    fields: dict[str, str] = {}
    errors: list[str] = []
    current = None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.startswith((" ", "\t")):
            if current is None:
                errors.append(f"header line {n}: continuation line before any field")
            else:
                fields[current] += "\n" + ("" if line.strip() == "." else line.strip())
            continue
        name, sep, value = line.partition(":")
        if not sep or " " in name:
            errors.append(f"header line {n}: expected `Field: value`, got {line[:60]!r}")
            continue
        if name not in FIELDS:
            errors.append(f"unknown header field {name!r} (allowed: {', '.join(FIELDS)})")
        if name in fields:
            errors.append(f"header field {name} given twice")
        fields[name] = value.strip()
        current = name
    return fields, errors


def _check_fields(fields: dict[str, str]) -> list[str]:
    errors = [f"missing header field {f}" for f in FIELDS if f not in fields]
    status = fields.get("Status")
    if status is not None and status not in STATUSES:
        errors.append(f"Status {status!r} is not one of {', '.join(STATUSES)}")
    per_request = fields.get("Per-Request")
    if per_request is not None and per_request not in ("yes", "no"):
        errors.append(f"Per-Request {per_request!r} must be yes or no")
    exact = fields.get("Exactness")
    if exact is not None and not (exact == "same-bits" or re.match(r"^changes-output: \S", exact)):
        errors.append(f"Exactness {exact!r} must be `same-bits` or `changes-output: <why>`")
    up = fields.get("Upstream-Status")
    if up is not None:
        word = up.split()[0] if up.split() else ""
        if word not in UPSTREAM_STATUSES:
            errors.append(f"Upstream-Status {up!r} must start with one of {', '.join(UPSTREAM_STATUSES)}")
        elif word == "Inappropriate" and not re.search(r"\[.+\]", up):
            errors.append("Upstream-Status Inappropriate needs a reason in [brackets]")
    date = fields.get("Last-Update")
    if date is not None and not _is_date(date):
        errors.append(f"Last-Update {date!r} must be YYYY-MM-DD")
    for name in ("Description", "Gain", "Modules"):
        if name in fields and not fields[name].strip():
            errors.append(f"header field {name} is empty")
    return errors


def _is_date(text: str) -> bool:
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        return False
    try:
        datetime.date.fromisoformat(text)
    except ValueError:  # 2026-13-45 has the shape of a date but is none
        return False
    return True


def read_series_list(series_dir: Path) -> tuple[list[str], list[Problem]]:
    listing = series_dir / "series"
    if not listing.is_file():
        return [], [Problem("series", "missing; it lists the patches in order")]
    names, problems = [], []
    for n, raw in enumerate(listing.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line in names:
            problems.append(Problem("series", f"line {n}: {line} is listed twice"))
            continue
        names.append(line)
    return names, problems


def load(series_dir: Path = SERIES_DIR, overlay: Path | None = None) -> tuple[Series, list[Problem]]:
    """Parse the series; every problem that needs no upstream tree is returned. The overlay is
    engine/ beside series_dir unless named."""
    overlay = series_dir.parent / "engine" if overlay is None else overlay
    overlay_set = set(overlay_files(overlay))
    claimed: set[str] = set()
    names, problems = read_series_list(series_dir)
    patches: list[Patch] = []
    on_disk = {p.name for p in series_dir.iterdir() if p.is_file() and p.name != "series"} \
        if series_dir.is_dir() else set()
    for extra in sorted(on_disk - set(names)):
        problems.append(Problem(extra, "is in patches/ but not listed in patches/series"))
    seen_numbers: dict[int, str] = {}
    seen_knobs: dict[str, str] = {}
    for name in names:
        m = FILE_RE.match(name)
        if not m:
            problems.append(Problem(name, "file name must look like NNNN-slug.patch"))
            continue
        path = series_dir / name
        if not path.is_file():
            problems.append(Problem(name, "is listed in patches/series but does not exist"))
            continue
        number = int(m.group(1))
        if number in seen_numbers:
            problems.append(Problem(name, f"number {m.group(1)} is also used by {seen_numbers[number]}"))
        seen_numbers[number] = name
        header, diff = split_patch(path.read_text())
        fields, errors = parse_header(header)
        errors += _check_fields(fields)
        modules, module_errors = _parse_modules(fields.get("Modules", "none"), overlay_set)
        errors += module_errors
        claimed.update(modules)
        if not diff.strip() and not modules:
            errors.append("no diff after the `---` line that ends the header and no Modules: "
                          "a patch changes upstream's files, the overlay's, or both")
        knob = None
        if "Knob" in fields:
            declared = True  # False when the declaration itself is broken (reported as such)
            try:
                knob = parse_declaration(fields["Knob"], per_request=fields.get("Per-Request") == "yes",
                                         patch=path.stem, description=fields.get("Description", ""))
            except KnobError as e:
                errors.append(f"Knob: {e}")
                declared = False
            if knob is None and declared and fields.get("Status") not in (None, "infrastructure"):
                errors.append("only an infrastructure patch may have `Knob: none`; "
                              "every behaviour change needs its own knob")
            if knob is None and declared and fields.get("Per-Request") == "yes":
                errors.append("Per-Request: yes needs a knob")
        if knob is not None:
            if knob.name in seen_knobs:
                errors.append(f"knob {knob.name} is also declared by {seen_knobs[knob.name]}")
            seen_knobs[knob.name] = name
        depends, dep_errors = _parse_depends(fields.get("Depends", "none"), number, names)
        errors += dep_errors
        problems += [Problem(name, e) for e in errors]
        patches.append(Patch(path=path, number=number, slug=m.group(2), fields=fields, diff=diff,
                             knob=knob, depends=depends, modules=modules))
    for rel in sorted(overlay_set - claimed):
        problems.append(Problem("series", f"engine/{rel} is named by no patch's Modules field; "
                                          "add it to the patch that brings it"))
    return Series(series_dir, patches, overlay if overlay.is_dir() else None), problems


def load_usable(series_dir: Path = SERIES_DIR) -> Series:
    """The series, for a verb that builds or serves it: any problem is a SeriesError that names
    every one and where the full report is."""
    loaded, problems = load(series_dir)
    if problems:
        raise SeriesError(problems, "run `patchbay check` for the full report")
    return loaded


def _parse_modules(text: str, overlay_set: set[str]) -> tuple[tuple[str, ...], list[str]]:
    if text.strip().lower() in ("", "none"):
        return (), []
    modules, errors = [], []
    for item in (t.strip() for t in text.replace("\n", " ").split(",")):
        if not item:
            continue
        if item not in overlay_set:
            errors.append(f"Modules names {item}, which is not a file under engine/ "
                          f"(paths are relative to engine/, e.g. _pb/knobs.py)")
        elif item in modules:
            errors.append(f"Modules names {item} twice")
        else:
            modules.append(item)
    return tuple(modules), errors


def _parse_depends(text: str, number: int, names: list[str]) -> tuple[tuple[str, ...], list[str]]:
    if text.strip().lower() in ("", "none"):
        return (), []
    own_index = next(i for i, n in enumerate(names) if n[:4] == f"{number:04d}")
    deps, errors = [], []
    for item in (t.strip() for t in text.split(",")):
        target = next((n for n in names if item in (n[:4], Path(n).stem, n)), None)
        if target is None:
            errors.append(f"Depends on {item}, which is not in the series")
        elif names.index(target) == own_index:
            errors.append(f"Depends on {item}, which is this patch itself")
        elif names.index(target) > own_index:
            errors.append(f"Depends on {item}, which comes later in the series (move it earlier)")
        else:
            deps.append(Path(target).stem)
    return tuple(deps), errors


# ---- applying ---------------------------------------------------------------------------


def _hunks(diff: str) -> dict[str, list[tuple[int, str]]]:
    """file -> [(old start line, hunk header)] in order."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in diff.splitlines():
        m = re.match(r"^diff --git a/(\S+) b/", line)
        if m:
            current = m.group(1)
            out.setdefault(current, [])
            continue
        h = HUNK_RE.match(line)
        if h and current:
            out[current].append((int(h.group(1)), line.split(" @@")[0] + " @@"))
    return out


def explain_failure(patch: Patch, stderr: str) -> str:
    """Turn git apply's complaint into `file, hunk #k (@@ ... @@)`."""
    hunks = _hunks(patch.diff)
    m = re.search(r"patch failed: (\S+):(\d+)", stderr)
    if m:
        path, line = m.group(1), int(m.group(2))
        for k, (start, header) in enumerate(hunks.get(path, []), 1):
            if start == line:
                return f"{path}, hunk #{k} ({header}) does not apply"
        return f"{path} near line {line} does not apply"
    m = re.search(r"error: (\S+): (does not exist in index|No such file or directory|already exists in working directory)",
                  stderr)
    if m:
        return f"{m.group(1)}: {m.group(2)}"
    return stderr.strip().splitlines()[-1] if stderr.strip() else "git apply failed"


def try_apply(patch: Patch, tree: Path) -> tuple[str, str]:
    """Apply one patch onto tree. Returns (outcome, detail) with outcome one of
    'applied', 'already-upstream', 'failed'. Nothing is written unless it applies.
    A patch whose change is all in the overlay has no hooks to apply."""
    if not patch.has_hooks:
        return "applied", ""
    args = ["apply", "--whitespace=nowarn", "-p1"]
    reverse = git([*args, "--check", "-R", "-"], tree, check=False, input=patch.diff)
    if reverse.returncode == 0:
        return "already-upstream", "reverse-applies: upstream already has this change; drop it from the series"
    forward = git([*args, "-"], tree, check=False, input=patch.diff)
    if forward.returncode == 0:
        return "applied", ""
    return "failed", explain_failure(patch, forward.stderr)


def scratch_copy(upstream_dir: Path, dest: Path, ref: str = "HEAD") -> Path:
    """A throwaway checkout of upstream_dir at ref, sharing its objects."""
    git(["clone", "-q", "--shared", "--no-checkout", str(upstream_dir), str(dest)], upstream_dir.parent)
    git(["checkout", "-q", ref], dest)
    return dest


def apply_series(series: Series, tree: Path) -> None:
    """Apply every patch in order onto tree; stop at the first that does not apply."""
    for patch in series.patches:
        outcome, detail = try_apply(patch, tree)
        if outcome != "applied":
            raise SeriesError([Problem(patch.path.name, f"{outcome}: {detail}")])


def overlay_edits(series: Series, src_path: str) -> list[Problem]:
    """Hunks that edit a file the overlay provides: that code belongs in engine/ itself."""
    mirrored = {f"{src_path}/{rel}" for rel in series.overlay_files()}
    return [Problem(p.path.name, f"a hunk edits {f}, an overlay file; change engine/{f[len(src_path) + 1:]} "
                                 "instead and name it under Modules")
            for p in series.patches for f in p.files() if f in mirrored]


def check(series_dir: Path, upstream_dir: Path, ref: str, src_path: str = "src/transformers"
          ) -> tuple[Series, list[Problem]]:
    """Everything `patchbay check` reports: header problems, overlay problems, apply problems."""
    series, problems = load(series_dir)
    problems += overlay_edits(series, src_path)
    with tempfile.TemporaryDirectory() as tmp:
        tree = scratch_copy(upstream_dir, Path(tmp) / "tree", ref)
        for patch in series.patches:
            outcome, detail = try_apply(patch, tree)
            if outcome != "applied":
                problems.append(Problem(patch.path.name, f"{outcome}: {detail}"))
        shutil.rmtree(tree, ignore_errors=True)
    return series, problems

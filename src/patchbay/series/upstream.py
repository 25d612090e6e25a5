"""The pinned upstream engine: read the lock, materialize the pristine source, verify it.

`upstream/` is either a populated git submodule (checked on its `src/` tree) or a local
git repo made here from the pinned sdist: downloaded, sha256-checked, unpacked and
committed with a fixed identity, then tagged with the lock's reference tag.
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .. import ROOT
from .gitutil import changed_files, commit_all, git, init_repo, worktree_tree

LOCK_PATH = ROOT / "upstream.lock"
UPSTREAM_DIR = ROOT / "upstream"
SDIST_CACHE = ROOT / ".cache" / "sdists"


class UpstreamError(RuntimeError):
    """A problem with the pinned source, worded for the operator."""


@dataclass(frozen=True)
class Lock:
    name: str
    version: str
    sdist_sha256: str
    tree: str  # git tree id of the whole unpacked sdist
    src_tree: str  # git tree id of src/<package>: what a submodule must match
    ref_tag: str
    src_path: str = "src/transformers"

    @classmethod
    def read(cls, path: Path = LOCK_PATH) -> "Lock":
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise UpstreamError(f"{path}: missing; the pin is required (see README)") from None
        except tomllib.TOMLDecodeError as e:
            raise UpstreamError(f"{path}: not valid TOML: {e}") from None
        fields = {f for f in cls.__dataclass_fields__}
        unknown = set(data) - fields
        if unknown:
            raise UpstreamError(f"{path}: unknown keys {sorted(unknown)} (allowed: {sorted(fields)})")
        missing = sorted(f for f, spec in cls.__dataclass_fields__.items()
                         if f not in data and spec.default is dataclasses.MISSING)
        if missing:
            raise UpstreamError(f"{path}: missing keys {missing}")
        not_text = sorted(k for k, v in data.items() if not isinstance(v, str))
        if not_text:  # version = 5.23 would parse as a float and name another release
            raise UpstreamError(f"{path}: {', '.join(not_text)} must be quoted strings")
        return cls(**data)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch_sdist(name: str, version: str, cache: Path = SDIST_CACHE) -> Path:
    """The sdist of name==version, from the cache or through pip (which reads the host's
    own index configuration, so no registry is named here)."""
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(f"{name}-{version}.tar.gz"))
    if found:
        return found[0]
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary=:all:",
             "--no-build-isolation", "-q", "-d", tmp, f"{name}=={version}"],
            capture_output=True, text=True)
        got = sorted(Path(tmp).glob("*.tar.gz"))
        if proc.returncode != 0 or not got:
            raise UpstreamError(f"could not download the {name} {version} sdist: "
                                f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        target = cache / got[0].name
        shutil.move(str(got[0]), target)
        return target


def unpack_sdist(tarball: Path, dest: Path) -> None:
    """Unpack into dest, dropping the archive's single top-level folder."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar, tempfile.TemporaryDirectory() as tmp:
        # The data filter refuses links and paths that leave tmp; Python before 3.11.4 (Debian
        # bookworm's 3.11.2, inside the image) lacks it, and the sdist's sha256 was checked anyway.
        tar.extractall(tmp, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        tops = list(Path(tmp).iterdir())
        if len(tops) != 1 or not tops[0].is_dir():
            raise UpstreamError(f"{tarball.name}: expected one top-level folder, found {len(tops)}")
        for item in tops[0].iterdir():
            shutil.move(str(item), dest / item.name)


def materialize_release(name: str, version: str, dest: Path, *, expected_sha256: str | None = None,
                        tag: str | None = None, sdist: Path | None = None) -> str:
    """Put name==version's pristine source into dest as a one-commit git repo.
    Returns the commit. The sdist's sha256 is checked when one is expected."""
    tarball = sdist or fetch_sdist(name, version)
    actual = sha256_file(tarball)
    if expected_sha256 and actual != expected_sha256:
        raise UpstreamError(f"{tarball}: sha256 {actual} does not match the lock's {expected_sha256}; "
                            "delete the file and download it again, or fix the lock")
    if dest.exists() and any(dest.iterdir()):
        raise UpstreamError(f"{dest}: exists and is not empty; refusing to overwrite it")
    unpack_sdist(tarball, dest)
    init_repo(dest)
    commit = commit_all(dest, f"{name} {version} (sdist sha256 {actual})")
    if tag:
        git(["tag", tag], dest)
    return commit


def ensure(lock: Lock | None = None, dest: Path = UPSTREAM_DIR, *, sdist: Path | None = None,
           progress=lambda *_: None) -> Path:
    """Make sure dest holds the pinned source and that it matches the lock."""
    lock = lock or Lock.read()
    populated = dest.exists() and any(dest.iterdir())
    if not populated:
        progress(f"materializing {lock.name} {lock.version} into {dest} from its sdist (sha256-checked)")
        if dest.exists():
            dest.rmdir()  # an empty submodule folder: fill it from the sdist instead
        materialize_release(lock.name, lock.version, dest, expected_sha256=lock.sdist_sha256,
                            tag=lock.ref_tag, sdist=sdist)
    verify(lock, dest)
    return dest


def verify(lock: Lock, dest: Path = UPSTREAM_DIR) -> None:
    """Refuse a tree that differs from the lock, naming the files that differ."""
    if not (dest / ".git").exists():
        raise UpstreamError(f"{dest}: not a git checkout; move it away and run `patchbay upstream`")
    src_tree = worktree_tree(dest, lock.src_path)
    if src_tree == lock.src_tree:
        return
    reference = git(["rev-parse", "-q", "--verify", f"{lock.ref_tag}^{{tree}}:{lock.src_path}"],
                    dest, check=False).stdout.strip()
    where = f"{dest}/{lock.src_path}"
    if not reference:
        raise UpstreamError(f"{where}: tree {src_tree} differs from the lock's {lock.src_tree} and the "
                            f"reference tag {lock.ref_tag} is missing; move {dest} away and run "
                            "`patchbay upstream` to materialize it from the pinned sdist")
    diffs = changed_files(dest, reference, src_tree)
    if not diffs:  # the tag itself was moved or rewritten
        raise UpstreamError(f"{where}: tag {lock.ref_tag} does not match the lock; move {dest} away "
                            "and run `patchbay upstream`")
    shown = ", ".join(diffs[:10]) + (f" and {len(diffs) - 10} more" if len(diffs) > 10 else "")
    raise UpstreamError(f"{where}: differs from the pin ({shown}); upstream/ is never edited: "
                        f"undo with `git -C {dest} checkout -- . && git -C {dest} clean -fd`")


def compute_lock(name: str, version: str, sdist: Path, ref_tag: str, src_path: str = "src/transformers") -> Lock:
    """The lock entries for a release, computed from its sdist (used to write upstream.lock)."""
    with tempfile.TemporaryDirectory() as tmp:
        dest = Path(tmp) / "tree"
        materialize_release(name, version, dest, sdist=sdist)
        return Lock(name=name, version=version, sdist_sha256=sha256_file(sdist),
                    tree=worktree_tree(dest), src_tree=worktree_tree(dest, src_path),
                    ref_tag=ref_tag, src_path=src_path)

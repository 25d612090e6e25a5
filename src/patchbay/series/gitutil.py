"""Thin wrappers over the git command line, shared by upstream, series and build."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

# A fixed identity and date make the commits we create reproducible byte for byte.
_FIXED_ENV = {
    "GIT_AUTHOR_NAME": "patchbay",
    "GIT_AUTHOR_EMAIL": "patchbay@localhost",
    "GIT_COMMITTER_NAME": "patchbay",
    "GIT_COMMITTER_EMAIL": "patchbay@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000",
    "GIT_CONFIG_NOSYSTEM": "1",
}


class GitError(RuntimeError):
    def __init__(self, args: list[str], returncode: int, stdout: str, stderr: str):
        self.args_ = args
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        super().__init__(f"git {' '.join(args)} failed ({returncode}): {stderr.strip() or stdout.strip()}")


def git(args: list[str], cwd: Path, *, check: bool = True, env: dict | None = None,
        input: str | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **_FIXED_ENV, **(env or {})}
    proc = subprocess.run(["git", *args], cwd=cwd, env=full_env, input=input,
                          capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise GitError(args, proc.returncode, proc.stdout, proc.stderr)
    return proc


def init_repo(path: Path) -> None:
    """A fresh repo with settings that make tree hashes depend on file bytes only."""
    path.mkdir(parents=True, exist_ok=True)
    git(["init", "-q", "-b", "main"], path)
    git(["config", "core.autocrlf", "false"], path)
    git(["config", "core.fileMode", "true"], path)
    git(["config", "commit.gpgsign", "false"], path)


def worktree_tree(path: Path, prefix: str | None = None) -> str:
    """The git tree id of the working copy as it is now (ignored files included),
    computed through a scratch index so the repo's own index is left untouched."""
    # one scratch index a process: two patchbay commands on one repository at once (a test run
    # beside a build) would otherwise meet at the same index's lock file
    name = f"patchbay-scratch-index-{os.getpid()}"
    index = path / ".git" / name if (path / ".git").is_dir() else None
    if index is None:
        gitdir = git(["rev-parse", "--absolute-git-dir"], path).stdout.strip()
        index = Path(gitdir) / name
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        git(["add", "-A", "-f", "."], path, env=env)
        args = ["write-tree"] + ([f"--prefix={prefix}/"] if prefix else [])
        return git(args, path, env=env).stdout.strip()
    finally:
        index.unlink(missing_ok=True)


def commit_all(path: Path, message: str) -> str:
    git(["add", "-A", "-f", "."], path)
    git(["commit", "-q", "--allow-empty", "-m", message], path)
    return git(["rev-parse", "HEAD"], path).stdout.strip()


def changed_files(path: Path, old_tree: str, new_tree: str) -> list[str]:
    out = git(["diff-tree", "-r", "--name-status", old_tree, new_tree], path).stdout
    return [line.replace("\t", " ") for line in out.splitlines() if line.strip()]

"""Serving behind one interface: the verbs start, stop, status, logs and watch (and build, what a
start needs) of a runtime, chosen once from the config's RUNTIME, so the CLI never asks which one runs.

Each method does the whole verb, its output included, and returns the verb's exit code (0 done,
1 failed, or for `status` crashed or unhealthy; 3 `status` with nothing running); bad input
raises verb.Fail with code 2.
"""

from __future__ import annotations

from typing import Protocol

from .config import Config


class Runtime(Protocol):
    cfg: Config

    def build(self) -> int:
        """Build what `start` serves (the engine wheel, or the serving image on every node)."""

    def start(self) -> int:
        """Build what is missing and serve; returns once a streamed token came back."""

    def stop(self) -> int: ...

    def status(self) -> int:
        """What runs, as a table; 3 when nothing does."""

    def logs(self, rank: int, lines: int, follow: bool) -> int: ...

    def watch(self, interval: float, once: bool, unhealthy: int = 3) -> int:
        """Keep it serving: start when none runs, restart when a rank died or `unhealthy` health
        checks in a row failed (runtime.watch's loop)."""


def runtime_for(cfg: Config, kind: str | None = None) -> Runtime:
    """The runtime of cfg.runtime (or of `kind`, for `build --image` on a local config)."""
    if (kind or cfg.runtime) == "docker":
        from .docker.verbs import Docker  # the Docker SDK only where it is used

        return Docker(cfg)
    from .local import Local

    return Local(cfg)

"""The watchdog's loop, one for both runtimes: check, count failed health checks, restart.

A runtime gives it `check() -> (down, health)`: down says why the server does not run ('' while
every rank does), health is `ok` or why not; and `restart() -> str`, which re-reads the config,
stops what is left and starts again, returning the line that says what now serves. Quiet while
all is well; one timestamped line for each failed check, restart and failed restart.
"""

from __future__ import annotations

import time

from ..series.build import BuildError
from ..series.series import SeriesError
from ..verb import Fail
from .config import ConfigError
from .launch import LaunchError

# What a failed restart raises; the watchdog says so and tries again at the next check.
RESTART_ERRORS = (Fail, SeriesError, BuildError, LaunchError, ConfigError)


def stamp() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def loop(check, restart, what: str, interval: float, unhealthy: int, once: bool, say=None) -> int:
    """Restart `what` (`the server`, `the pair`) when it does not run, or when `unhealthy` health
    checks in a row failed. With once, one check (and restart): exit 0 if all is well after it."""
    say = say or (lambda line: print(line, flush=True))
    bad = 0
    while True:
        down, health = check()
        bad = bad + 1 if (down or health != "ok") else 0
        if not down and bad and bad < unhealthy:
            say(f"{stamp()} watch: health {health} ({bad} of {unhealthy} failed checks before a restart)")
        if down or bad >= unhealthy:
            why = down or f"health {health}, {bad} failed checks in a row"
            say(f"{stamp()} watch: restarting {what} ({why})")
            try:
                say(f"{stamp()} watch: {restart()}")
                bad = 0
            except RESTART_ERRORS as e:
                say(f"{stamp()} watch: restart failed: {e}")
                bad = max(bad, 1)
        if once:
            return 0 if bad == 0 else 1
        time.sleep(interval)

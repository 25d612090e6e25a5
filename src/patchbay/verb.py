"""What a verb is, whichever layer defines it: an exit code, errors as one line for the
operator, generated files written or checked, key/value tables. Every layer may import this; it imports nothing
of patchbay's but the root.

Exit codes: 0 done, 1 a check failed or the operation failed, 2 bad input (config,
arguments), 3 `status` with nothing running.
"""

from __future__ import annotations

import sys
from pathlib import Path

from . import ROOT


class Fail(Exception):
    """One line for the operator and the exit code that goes with it."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


def guarded(verb: str, call, expected: tuple[type[BaseException], ...] = ()) -> int:
    """call()'s exit code. A Fail, or one of the `expected` errors (exit 1), is printed as one
    line on stderr, `patchbay VERB: message`; an interrupt exits 130."""
    try:
        return call()
    except Fail as e:
        print(f"patchbay {verb}: {e}", file=sys.stderr)
        return e.code
    except expected as e:
        print(f"patchbay {verb}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def generated(path: Path, text: str, check: bool, regenerate: str, detail: str = "") -> int:
    """Write a generated file, or with check only say whether it is stale (exit 1 if so)."""
    shown = path.resolve().relative_to(ROOT) if ROOT in path.resolve().parents else path
    if check:
        if not path.is_file() or path.read_text() != text:
            print(f"{shown} is stale; run `{regenerate}`")
            return 1
        print(f"{shown} is up to date{detail}")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {shown}{detail}")
    return 0


def print_rows(rows: list[tuple[str, object]]) -> None:
    """A status table: one `key  value` line a row, the keys aligned."""
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")

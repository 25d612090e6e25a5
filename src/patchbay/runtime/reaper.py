"""The engine's parent on this machine: starts it, waits for it, and writes down how it ended.

    python -I reaper.py PID_FILE EXIT_FILE -- CMD ARGS...

runs CMD in a process group of its own (so stopping it stops all it started, and not this
parent), writes its pid to PID_FILE, and once it exits, for whatever reason, writes EXIT_FILE:
{"pid", "code", "signal", "at"} (code as Python reports it: -9 for SIGKILL). A stop removes that
record; one that is still there means the engine ended without a stop, which `status` reports as
a crash. This process exits with CMD's code (128 + N for signal N).

Standard library only and run by its path (launch does), so it needs nothing of patchbay's on
the engine's PYTHONPATH.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # a reader sees the whole file or none


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: python -I reaper.py PID_FILE EXIT_FILE -- CMD ARGS...\n")
        return 2
    pid_file, exit_file, cmd = argv[0], argv[1], argv[3:]
    proc = subprocess.Popen(cmd, start_new_session=True)
    _write(pid_file, f"{proc.pid}\n")
    code = proc.wait()
    name = signal.Signals(-code).name if code < 0 else None
    _write(exit_file, json.dumps({"pid": proc.pid, "code": code, "signal": name, "at": time.time()}) + "\n")
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

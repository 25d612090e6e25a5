"""The engine's parent: it records how its child ended, exits as the child did, and runs
without patchbay on the path (launch runs it by its file, isolated)."""

import json
import os
import signal
import subprocess
import sys
import time

from patchbay.runtime import launch


def reap(tmp_path, code: str) -> tuple[subprocess.Popen, launch.RunFiles]:
    files = launch.RunFiles(tmp_path)
    proc = subprocess.Popen([sys.executable, "-I", str(launch.REAPER), str(files.pid), str(files.rank_exit(0)), "--",
                             sys.executable, "-c", code], env={"PATH": os.environ["PATH"]})
    deadline = time.monotonic() + 10
    while not files.pid.is_file() and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc, files


def test_an_exit_of_its_own_is_recorded_with_its_code(tmp_path):
    proc, files = reap(tmp_path, "import sys; sys.exit(3)")
    assert proc.wait(10) == 3
    record = json.loads(files.rank_exit(0).read_text())
    assert record["code"] == 3 and record["signal"] is None and record["pid"] == int(files.pid.read_text())
    assert abs(record["at"] - time.time()) < 10
    assert launch.ended({"pid": record["pid"], "exit": record}).startswith("exit code 3 at ")


def test_a_kill_is_recorded_with_its_signal_and_the_child_had_its_own_group(tmp_path):
    proc, files = reap(tmp_path, "import time; time.sleep(60)")
    child = int(files.pid.read_text())
    assert os.getpgid(child) == child != os.getpgid(proc.pid)  # stop's killpg reaches the engine, not its parent
    os.kill(child, signal.SIGKILL)
    assert proc.wait(10) == 128 + 9
    record = json.loads(files.rank_exit(0).read_text())
    assert (record["code"], record["signal"]) == (-9, "SIGKILL")
    state = launch.rank_states(files)[0]
    assert state["alive"] is False and launch.ended(state).startswith("exit code -9 (SIGKILL) at ")
    assert launch.crashed(files)["ranks"][0]["exit"] == record


def test_a_pid_gone_without_a_record_is_still_a_crash(tmp_path):
    files = launch.RunFiles(tmp_path)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    files.pid.write_text(f"{gone.pid}\n")
    assert launch.running(files) is None
    assert launch.ended(launch.crashed(files)["ranks"][0]) == f"pid {gone.pid} is gone (no exit status recorded)"
    assert launch.stop(files) == [] and launch.crashed(files) is None and not files.pid.exists()


def test_usage(tmp_path):
    proc = subprocess.run([sys.executable, "-I", str(launch.REAPER), "only-one"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("usage:")

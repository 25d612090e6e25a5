"""The engine process's environment: one definition, used by every way an engine is started."""

import ast
import json
import subprocess
import sys

from patchbay import ROOT
from patchbay.runtime import procenv

SHOW = "import json, os; print(json.dumps(dict(os.environ)))"


def run(*args):
    return subprocess.run([sys.executable, "-m", "patchbay.runtime.procenv", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "0"})


def test_the_wrapper_runs_the_command_with_the_engine_environment():
    proc = run("--", sys.executable, "-c", SHOW)
    assert proc.returncode == 0, proc.stderr
    env = json.loads(proc.stdout)
    assert procenv.ENGINE.items() <= env.items()  # HF_HUB_OFFLINE=0 from outside is overridden
    assert not procenv.NO_MULTICAST.keys() & env.keys()


def test_ranks_also_get_multicast_off():
    proc = run("--ranks", "--", sys.executable, "-c", SHOW)
    env = json.loads(proc.stdout)
    assert {**procenv.ENGINE, **procenv.NO_MULTICAST}.items() <= env.items()


def test_a_missing_command_is_a_usage_error():
    for args in ((), ("--",), ("--ranks",), (sys.executable,)):
        proc = run(*args)
        assert proc.returncode == 2 and proc.stderr.startswith("usage: python -m patchbay.runtime.procenv"), args


def test_a_rank_environment_is_the_torch_distributed_one_with_multicast_off():
    env = procenv.rank(1, 2, "10.0.0.1", 29611)
    assert env == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
                   "MASTER_PORT": "29611", **procenv.NO_MULTICAST}
    assert procenv.rank(1, 2, "h", 1, local_rank=0)["LOCAL_RANK"] == "0"  # one GPU a node


def test_no_other_file_of_the_tooling_spells_the_environment_out():
    names = [*procenv.ENGINE, *procenv.NO_MULTICAST]
    places = [*(ROOT / "src" / "patchbay").rglob("*.py"), *(ROOT / "scripts").iterdir(), *(ROOT / "docker").iterdir()]
    found = [f"{p.relative_to(ROOT)}: {n}" for p in places if p.is_file() and p.name != "procenv.py"
             for n in names if n in p.read_text(errors="replace")]
    assert found == []


def test_the_engine_keeps_multicast_off_by_the_same_names():
    """0200's rank setup defaults these itself (an engine started by hand has no patchbay): the same values."""
    tree = ast.parse((ROOT / "engine" / "_pb" / "runtime" / "tp.py").read_text())
    nccl_env = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    and any(getattr(t, "id", "") == "NCCL_ENV" for t in n.targets))
    assert procenv.NO_MULTICAST.items() <= nccl_env.items()

"""The measure verbs run in this process (as the GPU jobs run them) say and exit as the CLI does."""

import sys

from patchbay import cli
from patchbay.measure import verbs


def test_run_gives_the_clis_exit_codes_and_messages(tmp_path, capsys):
    args = ["--results-dir", str(tmp_path / "results"), "--index", str(tmp_path / "RESULTS.md"), "--check"]
    assert verbs.run("results", args) == cli.main(["results", *args]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == out[1] and out[0].endswith("is stale; run `python -m patchbay results`")
    assert verbs.run("ab", ["--concurrency", "1,x", "--a-json", "{}", "--b-json", "{}"]) == 2
    err = capsys.readouterr().err
    assert err == "patchbay ab: --concurrency 1,x: expected comma-separated whole numbers, e.g. 1,4,8\n"


def test_the_recorded_command_names_the_entry_point(monkeypatch):
    import patchbay.device.__main__ as device_main

    monkeypatch.setattr(sys, "argv", [device_main.__file__, "ab", "--cuda-graphs", "--", "--reps", "2"])
    assert verbs.invocation() == "python -m patchbay.device ab --cuda-graphs -- --reps 2"
    monkeypatch.setattr(sys, "argv", [cli.__file__.replace("cli.py", "__main__.py"), "ab", "--window", "x y"])
    assert verbs.invocation() == "python -m patchbay ab --window 'x y'"
    monkeypatch.setattr(sys, "argv", ["/usr/local/bin/patchbay", "ab"])
    assert verbs.invocation() == "patchbay ab"

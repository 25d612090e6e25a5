"""The rebase report on a fixture release pair: one patch for each outcome, repo untouched."""

import hashlib

import pytest

from .fixtures_series import PKG, base_files, diff_for, make_sdist, module, patch_text, with_line, write_series
from patchbay.series import rebase, series, upstream
from patchbay.series.gitutil import git

MODULES = ("a", "b", "c", "d")


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rebase")
    v1_files = base_files(MODULES)
    v2_files = {
        **v1_files,
        "PKG-INFO": "Name: fixturepkg\nVersion: 2.0\n",
        f"{PKG}/new_in_v2.py": "NEW = 1\n",
        # Line 8 moves under 0020's hunk context; line 9 stays, so a 3-way merge is clean.
        f"{PKG}/b.py": with_line(module("b"), 8, "B_LINE_08 = 'v2'"),
        # The very line 0030 changes, changed differently: a real conflict.
        f"{PKG}/c.py": with_line(module("c"), 10, "C_LINE_10 = 'v2'"),
        # Exactly 0040's change: the release already has it.
        f"{PKG}/d.py": with_line(module("d"), 10, "D_LINE_10 = 'fixed'"),
    }
    v1 = make_sdist(tmp / "fixturepkg-1.0.tar.gz", "fixturepkg-1.0", v1_files)
    v2 = make_sdist(tmp / "fixturepkg-2.0.tar.gz", "fixturepkg-2.0", v2_files)
    up = tmp / "upstream"
    lock = upstream.compute_lock("fixturepkg", "1.0", v1, "v1.0", src_path=PKG)
    upstream.materialize_release("fixturepkg", "1.0", up, expected_sha256=lock.sdist_sha256, tag="v1.0", sdist=v1)

    changes = {
        "0010-clean.patch": {f"{PKG}/a.py": with_line(module("a"), 10, "A_LINE_10 = 'pb'")},
        "0020-threeway.patch": {f"{PKG}/b.py": with_line(module("b"), 10, "B_LINE_10 = 'pb'")},
        "0030-conflict.patch": {f"{PKG}/c.py": with_line(module("c"), 10, "C_LINE_10 = 'pb'")},
        "0040-upstreamed.patch": {f"{PKG}/d.py": with_line(module("d"), 10, "D_LINE_10 = 'fixed'")},
    }
    patches = {}
    for name, change in changes.items():
        knob = "PB_" + name[5:].split(".")[0].upper()
        patches[name] = patch_text(diff_for(up, change), Knob=f"{knob} type=bool default=0", Status="adopted")
    loaded, problems = series.load(write_series(tmp / "patches", patches))
    assert problems == []
    assert series.check(loaded.dir, up, "v1.0")[1] == []  # every patch applies to the pin
    return loaded, lock, up, v2


def repo_state(repo):
    return (git(["rev-parse", "HEAD"], repo).stdout, git(["status", "--porcelain", "--ignored"], repo).stdout,
            git(["for-each-ref"], repo).stdout, git(["stash", "list"], repo).stdout)


def test_rebase_reports_each_outcome_and_changes_nothing(scenario):
    loaded, lock, up, v2 = scenario
    before = repo_state(up)
    assert before[1] == ""

    outcomes, sha = rebase.rebase(loaded, lock, up, "2.0", sdist=v2)

    assert repo_state(up) == before
    upstream.verify(lock, up)
    assert sha == hashlib.sha256(v2.read_bytes()).hexdigest()
    by_patch = {o.patch: o for o in outcomes}
    assert [o.patch for o in outcomes] == ["0010-clean", "0020-threeway", "0030-conflict", "0040-upstreamed"]
    assert {p: o.result for p, o in by_patch.items()} == {
        "0010-clean": "clean", "0020-threeway": "3-way", "0030-conflict": "conflict",
        "0040-upstreamed": "already-upstream"}
    assert by_patch["0010-clean"].detail == ""
    assert f"{PKG}/b.py, hunk #1" in by_patch["0020-threeway"].detail
    conflict = by_patch["0030-conflict"].detail
    assert f"{PKG}/c.py, hunk #1" in conflict and f"3-way conflicts in: {PKG}/c.py" in conflict

    text = rebase.report(lock, "2.0", sha, outcomes)
    assert text.startswith("# Rebase report: fixturepkg 1.0 → 2.0\n")
    assert f"sdist sha256 `{lock.sdist_sha256}`" in text and f"sdist sha256 `{sha}`" in text
    assert "- Result: 1 clean, 1 needs 3-way (succeeds), 1 conflict, 1 already upstream\n" in text
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1] for line in text.splitlines()
            if line.startswith("| 00")}
    assert rows == {"0010-clean": "clean", "0020-threeway": "needs 3-way (succeeds)",
                    "0030-conflict": "conflict", "0040-upstreamed": "already upstream"}
    assert f"{PKG}/c.py" in next(line for line in text.splitlines() if line.startswith("| 0030-conflict"))


def test_rebase_onto_the_same_release_is_all_clean(scenario, tmp_path):
    loaded, lock, up, _ = scenario
    v1_again = make_sdist(tmp_path / "fixturepkg-1.0.tar.gz", "fixturepkg-1.0", base_files(MODULES))
    outcomes, _ = rebase.rebase(loaded, lock, up, "1.0", sdist=v1_again)
    assert [o.result for o in outcomes] == ["clean"] * 4
    text = rebase.report(lock, "1.0", "x", outcomes)
    assert "- Result: 4 clean\n" in text


def test_report_of_an_empty_series():
    lock = upstream.Lock(name="p", version="1", sdist_sha256="s", tree="t", src_tree="u", ref_tag="v1")
    text = rebase.report(lock, "2", "s2", [])
    assert "- Result: no patches\n" in text
    assert text.endswith("|---|---|---|\n")


def test_report_escapes_pipes_in_details():
    lock = upstream.Lock(name="p", version="1", sdist_sha256="s", tree="t", src_tree="u", ref_tag="v1")
    text = rebase.report(lock, "2", "s2", [rebase.Outcome("0010-x", "conflict", "a|b")])
    assert "| 0010-x | conflict | a/b |" in text

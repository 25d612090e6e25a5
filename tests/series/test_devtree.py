"""patchbay dev / export: the series as commits on the pin (overlay first), and back."""

from .fixtures_series import PKG, base_files, diff_for, make_upstream, module, patch_text, with_line, write_series, \
    write_tree
from patchbay.series import devtree, series
from patchbay.series.gitutil import git


def test_dev_then_export_round_trips_hooks_and_overlay(tmp_path):
    upstream_dir = tmp_path / "upstream"
    make_upstream(upstream_dir, base_files())
    root = tmp_path / "repo"
    write_tree(root / "engine", {"_pb/__init__.py": "", "_pb/alpha.py": "ALPHA = 1\n", "_pb/old.py": "OLD = 1\n"})
    a = module("a")
    hook = diff_for(upstream_dir, {f"{PKG}/a.py": with_line(a, 5, "from ._pb import alpha")})
    sdir = write_series(root / "patches", {
        "0010-infra.patch": patch_text("", Modules="_pb/__init__.py, _pb/old.py"),
        "0020-alpha.patch": patch_text(hook, Knob="PB_ALPHA type=bool default=0", Status="opt-in",
                                      Modules="_pb/alpha.py")})
    loaded, problems = series.load(sdir)
    assert problems == []
    dev = devtree.create(loaded, upstream_dir, "v1.0", dest=tmp_path / "dev", src_path=PKG)
    subjects = git(["log", "--reverse", "--format=%s", "v1.0..HEAD"], dev).stdout.split("\n")[:-1]
    assert subjects == [devtree.OVERLAY_SUBJECT, "0010-infra.patch", "0020-alpha.patch"]
    assert (dev / PKG / "_pb" / "alpha.py").read_text() == "ALPHA = 1\n"
    assert devtree.export(loaded, "v1.0", dev=dev, src_path=PKG) == []  # nothing changed yet

    # In the dev tree: change the hook and the overlay, drop one overlay file, add one, in 0020's commit.
    write_tree(dev, {f"{PKG}/a.py": with_line(a, 5, "from ._pb import alpha as _pb_alpha"),
                     f"{PKG}/_pb/alpha.py": "ALPHA = 2\n", f"{PKG}/_pb/beta.py": "BETA = 1\n"})
    (dev / PKG / "_pb" / "old.py").unlink()
    git(["add", "-A", "."], dev)
    git(["commit", "-q", "--amend", "--no-edit"], dev)
    changed = devtree.export(loaded, "v1.0", dev=dev, src_path=PKG)
    assert changed == ["patches/0020-alpha.patch", "engine/_pb/alpha.py", "engine/_pb/beta.py",
                       "engine/_pb/old.py (removed)"]
    text = (sdir / "0020-alpha.patch").read_text()
    assert "Modules: _pb/alpha.py" in text  # the header is kept
    assert "+from ._pb import alpha as _pb_alpha" in text and "_pb/alpha.py b/" not in text  # hooks only
    assert (root / "engine" / "_pb" / "alpha.py").read_text() == "ALPHA = 2\n"
    assert (root / "engine" / "_pb" / "beta.py").read_text() == "BETA = 1\n"
    assert not (root / "engine" / "_pb" / "old.py").exists()

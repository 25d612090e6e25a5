"""patches/: parsing, every problem load/check must report, applying, the digest."""

import pytest

from .fixtures_series import (PKG, base_files, diff_for, make_upstream, module, patch_text, with_line, write_series,
                              write_tree)
from patchbay.series import series, upstream
from patchbay.series.gitutil import git
from patchbay.series.series import SeriesError

INFRA, ALPHA, BETA = "0010-infra.patch", "0020-alpha.patch", "0030-beta.patch"


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    """A tiny tagged upstream (never modified by a test) and the diffs the fixture patches carry."""
    path = tmp_path_factory.mktemp("up") / "upstream"
    make_upstream(path, base_files())
    a, b = module("a"), module("b")
    diffs = {
        "infra": diff_for(path, {f"{PKG}/_pb/__init__.py": '"""Fixture hooks."""\n'}),
        "alpha": diff_for(path, {f"{PKG}/a.py": with_line(a, 5, "A_LINE_05 = 5 if not PB_ALPHA else 50")}),
        # Two hunks in b.py: lines 5 and 20 are far enough apart for separate hunks.
        "beta": diff_for(path, {f"{PKG}/b.py": with_line(with_line(b, 5, "B_LINE_05 = -5"), 20, "B_LINE_20 = -20")}),
        "gamma": diff_for(path, {f"{PKG}/c.py": with_line(module("c"), 9, "C_LINE_09 = -9")}),
        # Upstream is the postimage of this one: it reverse-applies.
        "upstreamed": diff_for(path, {f"{PKG}/c.py": with_line(module("c"), 3, "C_LINE_03 = 'old'")}, reverse=True),
    }
    assert diffs["beta"].count("\n@@ ") == 2
    return path, diffs


def good_patches(diffs, **beta_fields):
    return {
        INFRA: patch_text(diffs["infra"], Upstream_Status="Inappropriate [fixture machinery]",
                          Description="Fixture infrastructure.\n Adds the hook package.\n .\n Second paragraph."),
        ALPHA: patch_text(diffs["alpha"], Knob="PB_ALPHA type=bool default=0", Per_Request="yes",
                          Status="adopted", Depends="0010"),
        BETA: patch_text(diffs["beta"], **{"Knob": "PB_BETA type=int min=0 max=64 default=0", "Status": "opt-in",
                                           "Exactness": "changes-output: rounds differently",
                                           "Depends": "0010, 0020-alpha", **beta_fields}),
    }


def problems_for(problems, where):
    for p in problems:
        assert str(p).startswith(f"patches/{p.where}: ")
    return [p.message for p in problems if p.where == where]


def only_problem(problems, where, expected):
    """Exactly one problem, for `where`, containing `expected`."""
    assert [p.where for p in problems] == [where], [str(p) for p in problems]
    assert expected in problems[0].message, str(problems[0])
    return problems[0].message


# ---- a good series -----------------------------------------------------------------------


def test_good_series_loads_checks_clean_and_applies(tmp_path, up):
    upstream_dir, diffs = up
    sdir = write_series(tmp_path / "patches", good_patches(diffs))
    loaded, problems = series.load(sdir)
    assert problems == []
    assert [p.name for p in loaded.patches] == ["0010-infra", "0020-alpha", "0030-beta"]
    alpha, beta = loaded.patches[1].knob, loaded.patches[2].knob
    assert (alpha.name, alpha.type, alpha.per_request, alpha.patch) == ("PB_ALPHA", "bool", True, "0020-alpha")
    assert (beta.type, beta.min, beta.max, beta.per_request) == ("int", 0, 64, False)
    assert loaded.patches[0].knob is None
    assert loaded.patches[2].depends == ("0010-infra", "0020-alpha")
    assert loaded.patches[0].fields["Description"] == \
        "Fixture infrastructure.\nAdds the hook package.\n\nSecond paragraph."
    assert loaded.patches[2].files() == [f"{PKG}/b.py"]

    _, problems = series.check(sdir, upstream_dir, "v1.0")
    assert problems == []

    tree = series.scratch_copy(upstream_dir, tmp_path / "tree", "v1.0")
    series.apply_series(loaded, tree)
    assert (tree / PKG / "_pb" / "__init__.py").read_text() == '"""Fixture hooks."""\n'
    assert "A_LINE_05 = 5 if not PB_ALPHA else 50\n" in (tree / PKG / "a.py").read_text()
    b = (tree / PKG / "b.py").read_text()
    assert "B_LINE_05 = -5\n" in b and "B_LINE_20 = -20\n" in b
    # check and apply_series worked on copies: the fixture upstream is untouched.
    assert git(["status", "--porcelain"], upstream_dir).stdout == ""


# ---- problems found without an upstream tree ---------------------------------------------


def test_unlisted_file_is_reported(tmp_path, up):
    patches = good_patches(up[1])
    sdir = write_series(tmp_path / "p", {**patches, "0040-stray.patch": patches[ALPHA]}, order=list(patches))
    _, problems = series.load(sdir)
    only_problem(problems, "0040-stray.patch", "not listed in patches/series")


def test_listed_but_missing_file_is_reported(tmp_path, up):
    patches = good_patches(up[1])
    sdir = write_series(tmp_path / "p", patches, order=[*patches, "0040-gone.patch"])
    _, problems = series.load(sdir)
    only_problem(problems, "0040-gone.patch", "listed in patches/series but does not exist")


@pytest.mark.parametrize("name", ["40-short.patch", "0040-Upper.patch", "0040-gamma.diff", "0040_gamma.patch"])
def test_bad_file_name_is_reported(tmp_path, up, name):
    patches = good_patches(up[1])
    sdir = write_series(tmp_path / "p", {**patches, name: patch_text(up[1]["gamma"])})
    _, problems = series.load(sdir)
    only_problem(problems, name, "file name must look like NNNN-slug.patch")


def test_missing_series_file_is_reported(tmp_path, up):
    sdir = write_series(tmp_path / "p", good_patches(up[1]))
    (sdir / "series").unlink()
    _, problems = series.load(sdir)
    assert problems_for(problems, "series") == ["missing; it lists the patches in order"]


def test_same_patch_listed_twice_is_reported(tmp_path, up):
    patches = good_patches(up[1])
    sdir = write_series(tmp_path / "p", patches, order=[*patches, ALPHA])
    loaded, problems = series.load(sdir)
    # Line 1 of the fixture series file is a comment; the repeat is on line 5.
    only_problem(problems, "series", f"line 5: {ALPHA} is listed twice")
    assert len(loaded.patches) == 3


def test_duplicate_number_is_reported(tmp_path, up):
    patches = good_patches(up[1])
    extra = patch_text(up[1]["gamma"], Knob="PB_GAMMA type=bool default=0", Status="adopted")
    sdir = write_series(tmp_path / "p", {**patches, "0030-gamma.patch": extra})
    _, problems = series.load(sdir)
    only_problem(problems, "0030-gamma.patch", f"number 0030 is also used by {BETA}")


def test_duplicate_knob_is_reported(tmp_path, up):
    patches = good_patches(up[1])
    extra = patch_text(up[1]["gamma"], Knob="PB_ALPHA type=bool default=0", Status="adopted")
    sdir = write_series(tmp_path / "p", {**patches, "0040-gamma.patch": extra})
    _, problems = series.load(sdir)
    only_problem(problems, "0040-gamma.patch", f"knob PB_ALPHA is also declared by {ALPHA}")


def test_no_diff_after_separator_is_reported(tmp_path, up):
    patches = good_patches(up[1])
    sdir = write_series(tmp_path / "p", {**patches, "0040-empty.patch": patch_text("\n")})
    _, problems = series.load(sdir)
    only_problem(problems, "0040-empty.patch", "no diff after the `---` line")


HEADER_CASES = {
    "unknown field": ({"Origin": "vendor"}, "unknown header field 'Origin'"),
    "missing field": ({"Gain": None}, "missing header field Gain"),
    "empty description": ({"Description": ""}, "header field Description is empty"),
    "bad knob type": ({"Knob": "PB_BETA type=float default=0"}, "PB_BETA: type=float is not a knob type"),
    "bad knob name": ({"Knob": "BETA type=bool default=0"}, "knob name 'BETA' must look like PB_UPPER_CASE"),
    "bad default": ({"Knob": "PB_BETA type=enum values=x,y default=z"}, "PB_BETA=z is not a valid value (allowed: x, y)"),
    "int default out of range": ({"Knob": "PB_BETA type=int min=0 max=64 default=65"},
                                 "PB_BETA=65 is not a valid value (allowed: an integer from 0 to 64)"),
    "bool default 1": ({"Knob": "PB_BETA type=bool default=1"}, "PB_BETA: a bool knob's default must be 0"),
    "enum without values": ({"Knob": "PB_BETA type=enum default=x"}, "PB_BETA: type=enum needs values="),
    "int without min,max": ({"Knob": "PB_BETA type=int default=0"}, "PB_BETA: type=int needs integer min= and max="),
    "knob none on opt-in": ({"Knob": "none"}, "only an infrastructure patch may have `Knob: none`"),
    "bad Per-Request": ({"Per_Request": "sometimes"}, "Per-Request 'sometimes' must be yes or no"),
    "bad Status": ({"Status": "maybe"}, "Status 'maybe' is not one of infrastructure, adopted, opt-in, rejected"),
    "Exactness without why": ({"Exactness": "changes-output"}, "must be `same-bits` or `changes-output: <why>`"),
    "Exactness unknown": ({"Exactness": "exact"}, "Exactness 'exact' must be"),
    "bad Upstream-Status": ({"Upstream_Status": "Merged"}, "Upstream-Status 'Merged' must start with one of"),
    "Inappropriate without reason": ({"Upstream_Status": "Inappropriate"},
                                     "Upstream-Status Inappropriate needs a reason in [brackets]"),
    "Last-Update not ISO": ({"Last_Update": "29/11/2026"}, "Last-Update '29/11/2026' must be YYYY-MM-DD"),
    "Last-Update impossible": ({"Last_Update": "2026-13-45"}, "Last-Update '2026-13-45' must be YYYY-MM-DD"),
    "Depends on later": ({"Depends": "0040"}, "Depends on 0040, which comes later in the series"),
    "Depends on itself": ({"Depends": "0030-beta"}, "Depends on 0030-beta, which is this patch itself"),
    "Depends on missing": ({"Depends": "0010, 0099"}, "Depends on 0099, which is not in the series"),
}


@pytest.mark.parametrize("case", list(HEADER_CASES))
def test_header_problem_is_reported_for_its_patch(tmp_path, up, case):
    fields, expected = HEADER_CASES[case]
    patches = good_patches(up[1], **fields)
    later = patch_text(up[1]["gamma"], Knob="PB_GAMMA type=bool default=0", Status="adopted")
    sdir = write_series(tmp_path / "p", {**patches, "0040-gamma.patch": later})
    _, problems = series.load(sdir)
    only_problem(problems, BETA, expected)


def test_header_field_given_twice_is_reported(tmp_path, up):
    patches = good_patches(up[1])
    patches[BETA] = patches[BETA].replace("Status: opt-in\n", "Status: opt-in\nStatus: adopted\n")
    _, problems = series.load(write_series(tmp_path / "p", patches))
    only_problem(problems, BETA, "header field Status given twice")


def test_per_request_without_knob_is_reported(tmp_path, up):
    patches = good_patches(up[1])
    patches[INFRA] = patch_text(up[1]["infra"], Per_Request="yes")
    _, problems = series.load(write_series(tmp_path / "p", patches))
    only_problem(problems, INFRA, "Per-Request: yes needs a knob")


def test_knob_none_is_reported_next_to_other_header_problems(tmp_path, up):
    # A missing knob must not hide behind an unrelated mistake in the same header.
    patches = good_patches(up[1], Knob="none", Last_Update="someday")
    _, problems = series.load(write_series(tmp_path / "p", patches))
    messages = problems_for(problems, BETA)
    assert len(messages) == 2, messages
    assert any("must be YYYY-MM-DD" in m for m in messages)
    assert any("only an infrastructure patch may have `Knob: none`" in m for m in messages)


def test_bad_knob_declaration_is_not_also_called_knob_none(tmp_path, up):
    patches = good_patches(up[1], Knob="PB_BETA type=float default=0", Per_Request="yes")
    _, problems = series.load(write_series(tmp_path / "p", patches))
    only_problem(problems, BETA, "type=float is not a knob type")


# ---- problems found by applying ----------------------------------------------------------


def test_patch_that_does_not_apply_names_file_and_hunk(tmp_path, up):
    upstream_dir, diffs = up
    # Corrupt a context line that only the second hunk carries.
    assert diffs["beta"].count("\n B_LINE_22 = 22\n") == 1
    broken = diffs["beta"].replace("\n B_LINE_22 = 22\n", "\n B_LINE_22 = 2222\n")
    patches = good_patches({**diffs, "beta": broken})
    sdir = write_series(tmp_path / "p", patches)
    _, problems = series.check(sdir, upstream_dir, "v1.0")
    message = only_problem(problems, BETA, f"{PKG}/b.py, hunk #2 (@@ -17,7 +17,7 @@) does not apply")
    assert message.startswith("failed: ")

    loaded, _ = series.load(sdir)
    tree = series.scratch_copy(upstream_dir, tmp_path / "tree", "v1.0")
    with pytest.raises(SeriesError) as e:
        series.apply_series(loaded, tree)
    assert str(e.value).startswith(f"patches/{BETA}: failed: {PKG}/b.py, hunk #2")
    # Fail closed: the first hunk was not written either.
    assert (tree / PKG / "b.py").read_text() == module("b")
    assert "PB_ALPHA" in (tree / PKG / "a.py").read_text()  # earlier patches stay applied


def test_patch_for_a_missing_file_names_the_file(tmp_path, up):
    upstream_dir, diffs = up
    patches = good_patches({**diffs, "beta": diffs["beta"].replace("/b.py", "/zz.py")})
    _, problems = series.check(write_series(tmp_path / "p", patches), upstream_dir, "v1.0")
    only_problem(problems, BETA, f"failed: {PKG}/zz.py: ")


def test_reverse_applying_patch_is_reported_already_upstream(tmp_path, up):
    upstream_dir, diffs = up
    patches = good_patches(diffs)
    patches["0040-upstreamed.patch"] = patch_text(diffs["upstreamed"], Knob="PB_OLD type=bool default=0",
                                                  Status="adopted")
    sdir = write_series(tmp_path / "p", patches)
    _, problems = series.check(sdir, upstream_dir, "v1.0")
    message = only_problem(problems, "0040-upstreamed.patch", "already-upstream")
    assert "drop it from the series" in message

    loaded, _ = series.load(sdir)
    with pytest.raises(SeriesError, match="0040-upstreamed.patch: already-upstream"):
        series.apply_series(loaded, series.scratch_copy(upstream_dir, tmp_path / "tree", "v1.0"))


# ---- digest ------------------------------------------------------------------------------


def test_digest_is_stable_and_follows_bytes_and_order(tmp_path, up):
    lock = tmp_path / "upstream.lock"
    lock.write_text('name = "fixturepkg"\n')
    patches = good_patches(up[1])
    sdir = write_series(tmp_path / "p", patches)

    first = series.load(sdir)[0].digest(lock)
    assert series.load(sdir)[0].digest(lock) == first
    assert series.load(sdir)[0].build_id(lock) == first[:12]

    path = sdir / ALPHA
    original = path.read_bytes()
    path.write_bytes(original.replace(b"Fixture patch.", b"Fixture patch!", 1))
    assert series.load(sdir)[0].digest(lock) != first
    path.write_bytes(original)
    assert series.load(sdir)[0].digest(lock) == first

    write_series(sdir, {}, order=[INFRA, BETA, ALPHA])
    assert series.load(sdir)[0].digest(lock) != first
    write_series(sdir, {}, order=[INFRA, ALPHA, BETA])
    assert series.load(sdir)[0].digest(lock) == first

    lock.write_text('name = "fixturepkg2"\n')
    assert series.load(sdir)[0].digest(lock) != first


# ---- the real series ---------------------------------------------------------------------


def test_real_series_checks_clean():
    lock = upstream.Lock.read()
    upstream_dir = upstream.ensure(lock)
    checked, problems = series.check(series.SERIES_DIR, upstream_dir, lock.ref_tag, lock.src_path)
    assert [str(p) for p in problems] == []
    assert checked.patches, "the real series is empty"
    assert all(p.knob is not None or p.status == "infrastructure" for p in checked.patches)


# ---- the overlay (engine/) -----------------------------------------------------------------


def overlay_series(tmp_path, diffs, modules=None, files=None):
    """good_patches beside an overlay engine/_pb/{hooks,extra}.py; 0020 names both unless told."""
    root = tmp_path / "repo"
    write_tree(root / "engine", files if files is not None else
               {"_pb/hooks.py": "HOOKS = 1\n", "_pb/extra.py": "EXTRA = 2\n"})
    patches = good_patches(diffs)
    patches[ALPHA] = patch_text(diffs["alpha"], Knob="PB_ALPHA type=bool default=0", Per_Request="yes",
                                Status="adopted", Depends="0010",
                                Modules=modules if modules is not None else "_pb/hooks.py, _pb/extra.py")
    return write_series(root / "patches", patches), root / "engine"


def test_overlay_is_named_by_modules_and_mirrored_after_the_hooks(tmp_path, up):
    upstream_dir, diffs = up
    sdir, overlay = overlay_series(tmp_path, diffs)
    loaded, problems = series.load(sdir)
    assert problems == []
    assert loaded.overlay == overlay
    assert loaded.overlay_files() == ["_pb/extra.py", "_pb/hooks.py"]
    assert loaded.patches[1].modules == ("_pb/hooks.py", "_pb/extra.py")
    (overlay / "_pb" / "__pycache__").mkdir()
    (overlay / "_pb" / "__pycache__" / "hooks.cpython-311.pyc").write_bytes(b"\0")
    (overlay / "_pb" / "build_info.py").write_text("generated\n")
    assert loaded.overlay_files() == ["_pb/extra.py", "_pb/hooks.py"]  # caches and generated files are not ours

    tree = series.scratch_copy(upstream_dir, tmp_path / "tree", "v1.0")
    loaded.apply_to(tree, PKG)
    assert (tree / PKG / "_pb" / "hooks.py").read_text() == "HOOKS = 1\n"
    assert (tree / PKG / "_pb" / "__init__.py").read_text() == '"""Fixture hooks."""\n'  # the hooks still applied
    assert not (tree / PKG / "_pb" / "__pycache__").exists()
    assert not (tree / PKG / "_pb" / "build_info.py").exists()


def test_an_overlay_file_no_patch_names_is_reported(tmp_path, up):
    sdir, _ = overlay_series(tmp_path, up[1], modules="_pb/hooks.py")
    _, problems = series.load(sdir)
    only_problem(problems, "series", "engine/_pb/extra.py is named by no patch's Modules field")


def test_modules_naming_a_missing_file_is_reported(tmp_path, up):
    sdir, _ = overlay_series(tmp_path, up[1], modules="_pb/hooks.py, _pb/extra.py, _pb/gone.py")
    _, problems = series.load(sdir)
    only_problem(problems, ALPHA, "Modules names _pb/gone.py, which is not a file under engine/")


def test_a_patch_of_overlay_code_alone_needs_no_hooks(tmp_path, up):
    upstream_dir, diffs = up
    sdir, _ = overlay_series(tmp_path, diffs, modules="_pb/hooks.py")
    (sdir / "0040-extra.patch").write_text(patch_text("", Knob="PB_EXTRA type=bool default=0", Status="opt-in",
                                                     Modules="_pb/extra.py"))
    write_series(sdir, {}, order=[INFRA, ALPHA, BETA, "0040-extra.patch"])
    checked, problems = series.check(sdir, upstream_dir, "v1.0", PKG)
    assert problems == []
    assert checked.patches[-1].diff.strip() == "" and checked.patches[-1].modules == ("_pb/extra.py",)


def test_a_hunk_that_edits_an_overlay_file_is_reported(tmp_path, up):
    upstream_dir, diffs = up
    # engine/_pb/__init__.py would be mirrored over the file 0010's hunk creates
    sdir, _ = overlay_series(tmp_path, diffs, modules="_pb/__init__.py",
                             files={"_pb/__init__.py": '"""Overlay."""\n'})
    _, problems = series.check(sdir, upstream_dir, "v1.0", PKG)
    only_problem(problems, INFRA, f"a hunk edits {PKG}/_pb/__init__.py, an overlay file; "
                                  "change engine/_pb/__init__.py instead")


def test_digest_follows_the_overlay(tmp_path, up):
    lock = tmp_path / "upstream.lock"
    lock.write_text('name = "fixturepkg"\n')
    sdir, overlay = overlay_series(tmp_path, up[1])
    first = series.load(sdir)[0].digest(lock)
    (overlay / "_pb" / "extra.py").write_text("EXTRA = 3\n")
    assert series.load(sdir)[0].digest(lock) != first
    (overlay / "_pb" / "extra.py").write_text("EXTRA = 2\n")
    assert series.load(sdir)[0].digest(lock) == first
    (overlay / "_pb" / "__pycache__").mkdir()
    (overlay / "_pb" / "__pycache__" / "x.pyc").write_bytes(b"\1")
    assert series.load(sdir)[0].digest(lock) == first

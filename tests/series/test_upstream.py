"""The pin: materialize from an sdist, refuse a wrong hash or a used folder, verify, read the lock."""

import hashlib
import io
import tarfile

import pytest

from .fixtures_series import PKG, base_files, make_sdist
from patchbay.series import upstream
from patchbay.series.gitutil import git
from patchbay.series.upstream import Lock, UpstreamError


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    return make_sdist(tmp_path_factory.mktemp("sdist") / "fixturepkg-1.0.tar.gz", "fixturepkg-1.0", base_files())


@pytest.fixture(scope="module")
def lock(sdist):
    return upstream.compute_lock("fixturepkg", "1.0", sdist, "v1.0", src_path=PKG)


@pytest.fixture
def tree(tmp_path, sdist, lock):
    dest = tmp_path / "upstream"
    upstream.materialize_release("fixturepkg", "1.0", dest, expected_sha256=lock.sdist_sha256, tag="v1.0", sdist=sdist)
    return dest


def test_materialize_unpacks_below_the_top_folder_and_tags(tree, sdist):
    assert (tree / PKG / "a.py").read_text() == base_files()[f"{PKG}/a.py"]
    assert not (tree / "fixturepkg-1.0").exists()
    assert git(["status", "--porcelain"], tree).stdout == ""
    assert git(["rev-parse", "v1.0"], tree).stdout == git(["rev-parse", "HEAD"], tree).stdout
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert digest in git(["log", "-1", "--format=%s"], tree).stdout


def test_materialize_is_reproducible(tmp_path, sdist):
    one = upstream.materialize_release("fixturepkg", "1.0", tmp_path / "one", sdist=sdist)
    two = upstream.materialize_release("fixturepkg", "1.0", tmp_path / "two", sdist=sdist)
    assert one == two


def test_wrong_sha256_is_refused_naming_both_hashes(tmp_path, sdist):
    wrong = "0" * 64
    actual = hashlib.sha256(sdist.read_bytes()).hexdigest()
    with pytest.raises(UpstreamError) as e:
        upstream.materialize_release("fixturepkg", "1.0", tmp_path / "dest", expected_sha256=wrong, sdist=sdist)
    assert actual in str(e.value) and wrong in str(e.value)
    assert not (tmp_path / "dest").exists()


def test_non_empty_destination_is_refused(tmp_path, sdist):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "mine.txt").write_text("keep me\n")
    with pytest.raises(UpstreamError, match="exists and is not empty"):
        upstream.materialize_release("fixturepkg", "1.0", dest, sdist=sdist)
    assert [p.name for p in dest.iterdir()] == ["mine.txt"]


def test_sdist_without_a_single_top_folder_is_refused(tmp_path):
    two_tops = tmp_path / "two.tar.gz"
    with tarfile.open(two_tops, "w:gz") as tar:
        for top in ("one", "two"):
            info = tarfile.TarInfo(f"{top}/f.txt")
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(UpstreamError, match="expected one top-level folder, found 2"):
        upstream.materialize_release("fixturepkg", "1.0", tmp_path / "dest", sdist=two_tops)


def test_compute_lock_then_verify_passes(tree, lock, sdist):
    assert lock.sdist_sha256 == hashlib.sha256(sdist.read_bytes()).hexdigest()
    assert (lock.name, lock.version, lock.ref_tag, lock.src_path) == ("fixturepkg", "1.0", "v1.0", PKG)
    assert lock.tree == git(["rev-parse", "HEAD^{tree}"], tree).stdout.strip()
    assert lock.src_tree == git(["rev-parse", f"HEAD:{PKG}"], tree).stdout.strip()
    upstream.verify(lock, tree)
    assert upstream.ensure(lock, tree) == tree  # populated: verified, not materialized again


def test_ensure_materializes_an_empty_folder(tmp_path, lock, sdist):
    dest = tmp_path / "upstream"
    dest.mkdir()  # an uninitialized submodule looks like this
    upstream.ensure(lock, dest, sdist=sdist)
    assert git(["rev-parse", "--verify", "-q", "v1.0"], dest).returncode == 0


def test_edited_file_makes_verify_name_it(tree, lock):
    path = tree / PKG / "b.py"
    path.write_text(path.read_text().replace("B_LINE_07 = 7", "B_LINE_07 = 70"))
    with pytest.raises(UpstreamError) as e:
        upstream.verify(lock, tree)
    assert "M b.py" in str(e.value)
    assert "upstream/ is never edited" in str(e.value)
    # verify only looks: the edit is still there, the repo's own index untouched.
    assert git(["status", "--porcelain"], tree).stdout == f" M {PKG}/b.py\n"


def test_added_and_deleted_files_make_verify_name_them(tree, lock):
    (tree / PKG / "extra.py").write_text("X = 1\n")
    (tree / PKG / "c.py").unlink()
    with pytest.raises(UpstreamError) as e:
        upstream.verify(lock, tree)
    assert "A extra.py" in str(e.value) and "D c.py" in str(e.value)


def test_edit_outside_the_src_path_is_not_a_difference(tree, lock):
    (tree / "PKG-INFO").write_text("edited\n")
    upstream.verify(lock, tree)


def test_verify_refuses_a_folder_that_is_not_a_checkout(tmp_path, lock):
    (tmp_path / "plain").mkdir()
    with pytest.raises(UpstreamError, match="not a git checkout"):
        upstream.verify(lock, tmp_path / "plain")


def test_lock_round_trips_through_toml(tmp_path, lock):
    path = tmp_path / "upstream.lock"
    path.write_text("".join(f'{k} = "{getattr(lock, k)}"\n' for k in lock.__dataclass_fields__))
    assert Lock.read(path) == lock


@pytest.mark.parametrize("text, expected", [
    ('name = "x"\nversion = \n', "not valid TOML"),
    ('name = "x" version = "1"\n', "not valid TOML"),
    ('name = "x"\nversion = "1"\nsdist_sha256 = "a"\ntree = "b"\nsrc_tree = "c"\nref_tag = "d"\ncolour = "e"\n',
     "unknown keys ['colour']"),
    ('name = "x"\nversion = "1"\n', "missing keys ['ref_tag', 'sdist_sha256', 'src_tree', 'tree']"),
    ('name = "x"\nversion = 5.23\nsdist_sha256 = "a"\ntree = "b"\nsrc_tree = "c"\nref_tag = "d"\n',
     "version must be quoted strings"),
])
def test_bad_lock_file_is_a_clear_error(tmp_path, text, expected):
    path = tmp_path / "upstream.lock"
    path.write_text(text)
    with pytest.raises(UpstreamError) as e:
        Lock.read(path)
    assert str(e.value).startswith(f"{path}: ") and expected in str(e.value)


def test_missing_lock_file_is_a_clear_error(tmp_path):
    with pytest.raises(UpstreamError, match="missing; the pin is required"):
        Lock.read(tmp_path / "upstream.lock")


def test_real_lock_matches_the_pinned_sdist():
    lock = Lock.read()
    tarball = upstream.fetch_sdist(lock.name, lock.version)
    assert tarball.name == f"{lock.name}-{lock.version}.tar.gz"
    assert upstream.sha256_file(tarball) == lock.sdist_sha256


def test_real_lock_matches_a_fresh_computation():
    """tree and src_tree in upstream.lock are what the pinned sdist really unpacks to."""
    lock = Lock.read()
    computed = upstream.compute_lock(lock.name, lock.version, upstream.fetch_sdist(lock.name, lock.version),
                                     lock.ref_tag, lock.src_path)
    assert computed == lock

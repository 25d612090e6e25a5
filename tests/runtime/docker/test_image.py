"""image: what goes into the build context and the base recipe's inputs (no Docker needed)."""

import pytest

from patchbay.runtime.docker import image


def test_apt_mirror_reads_one_line_and_deb822_sources(tmp_path):
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.invalid/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.invalid/debian/ bookworm main contrib\n")
    assert image.apt_mirror(tmp_path) == "http://one.invalid/debian"
    (tmp_path / "sources.list").write_text("deb http://one.invalid/debian trixie main\n")
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://sec.invalid/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://two.invalid/debian\nSuites: bookworm bookworm-updates\nComponents: main\n")
    assert image.apt_mirror(tmp_path) == "http://two.invalid/debian"


def test_base_key_changes_with_each_input():
    keys = {image.base_key("http://a.invalid/debian", "torch==2.13.0"),
            image.base_key("http://b.invalid/debian", "torch==2.13.0"),
            image.base_key("http://a.invalid/debian", "torch==2.14.0")}
    assert len(keys) == 3 and image.base_key("http://a.invalid/debian", "torch==2.13.0") in keys


def test_requirements_keep_torch_and_transformers_out_and_pins_come_from_pyproject():
    reqs = image.serving_requirements()
    assert image.pinned("engine", "torch") == "torch==2.13.0"
    assert not any(r.startswith("torch==") for r in reqs)
    assert "transformers==5.23.0" in reqs and any(r.startswith("httpx==") for r in reqs)
    with pytest.raises(image.ImageError, match="no pin for nope in the engine extra"):
        image.pinned("engine", "nope")


def test_extra_ca_bundle_is_copied_or_refused(tmp_path):
    image.add_ca_bundle(tmp_path, None)
    assert (tmp_path / "ca" / "extra.crt").read_text() == ""
    pem = tmp_path / "corp.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    image.add_ca_bundle(tmp_path, pem)
    assert (tmp_path / "ca" / "extra.crt").read_text() == pem.read_text()
    with pytest.raises(image.ImageError, match="EXTRA_CA_BUNDLE=.*not a PEM certificate file"):
        image.add_ca_bundle(tmp_path, tmp_path / "missing.pem")

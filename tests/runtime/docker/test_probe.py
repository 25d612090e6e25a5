"""patchbay.probe, the node checks preflight runs inside a container, run here on this machine."""

import hashlib
import json
import os
import socket
import subprocess
import sys

from patchbay.runtime.docker import probe


def checkpoint(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    (root / "config.json").write_text('{"model_type": "glm4_moe"}')
    (root / "model.safetensors").write_bytes(b"weights" * 1000)
    return root


def test_model_manifest_is_cached_and_reused(tmp_path):
    root, cache = checkpoint(tmp_path), tmp_path / "cache"
    ok, detail, extra = probe.model(str(root), str(cache))
    assert ok and "2 files verified" in detail and "(2 hashed, 0 from the cached manifest)" in detail
    again = probe.model(str(root), str(cache))
    assert again[0] and "(0 hashed, 2 from the cached manifest)" in again[1] and again[2] == extra
    (root / "model.safetensors").write_bytes(b"other" * 1000)  # a changed shard is hashed again
    changed = probe.model(str(root), str(cache))
    assert "(1 hashed, 1 from the cached manifest)" in changed[1] and changed[2] != extra


def test_a_shard_that_differs_from_its_hf_cache_blob_name_fails(tmp_path):
    root = checkpoint(tmp_path)
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    data = b"real weights"
    good = blobs / hashlib.sha256(data).hexdigest()
    good.write_bytes(data)
    bad = blobs / hashlib.sha256(b"what the pin says").hexdigest()
    bad.write_bytes(b"something else")
    (root / "a.safetensors").symlink_to(good)
    assert probe.model(str(root), str(tmp_path / "c"))[0]
    (root / "b.safetensors").symlink_to(bad)
    ok, detail, _ = probe.model(str(root), str(tmp_path / "c"))
    assert not ok and "1 file(s) differ from their pinned hash: b.safetensors" in detail


def test_missing_checkpoint_and_busy_port_and_address(tmp_path):
    assert probe.model(str(tmp_path / "none"), str(tmp_path))[:2] == (False, f"no config.json in {tmp_path / 'none'}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        ok, detail = probe.port_free("127.0.0.1", s.getsockname()[1])
        assert not ok and "is in use" in detail
    assert probe.ifname("lo")[0] and not probe.ifname("nope0")[0]
    ok, detail, extra = probe.addr("127.0.0.1")
    assert ok and extra == {"ifname": "lo"}
    ok, detail, _ = probe.addr("192.0.2.77")
    assert not ok and "is not an address of this node (it has: 127.0.0.1 on lo" in detail


def test_runs_as_a_module_and_prints_json(tmp_path):
    root = checkpoint(tmp_path)
    spec = {"mem_gib": 0, "disk_gib": 0, "model": {"path": str(root), "cache": str(tmp_path / "c")}}
    out = subprocess.run([sys.executable, "-m", "patchbay.runtime.docker.probe", json.dumps(spec)], capture_output=True,
                         text=True, check=True, env={**os.environ})
    result = json.loads(out.stdout)
    assert set(result) == {"memory", "disk", "model"} and all(v[0] for v in result.values())

"""preflight: knob rows against an image's registry label, the table and its fixes (no Docker)."""

import json
from dataclasses import replace
from types import SimpleNamespace

from patchbay.runtime import config
from patchbay.runtime.docker import preflight
from patchbay.series.knobs import registry_json
from patchbay.runtime.docker.preflight import Row

from ...conftest import LOCAL


def image_with(series_knobs):
    return SimpleNamespace(labels={"org.patchbay.knobs": json.dumps(json.loads(registry_json(series_knobs)))})


def test_knobs_are_checked_against_the_images_registry(real_series):
    img = image_with(real_series.knobs())
    cfg = replace(LOCAL, knobs={"PB_SSE_DONE": "1"}, source="config/x.env")
    assert preflight.knob_rows(cfg, img, "pb-1") == [Row("config", "knobs", True, "1 knob(s) valid in image pb-1")]
    bad = replace(cfg, knobs={"PB_SSE_DONE": "2", "PB_NOPE": "1"})
    rows = preflight.knob_rows(bad, img, "pb-1")
    assert [(r.check, r.ok) for r in rows] == [("PB_NOPE", False), ("PB_SSE_DONE", False)]
    assert rows[0].fix == "remove or rename the PB_NOPE line in config/x.env"
    assert rows[1].detail == "PB_SSE_DONE=2 is not a valid value (allowed: 0, 1)"


def test_an_image_without_the_tensor_parallel_patch_names_it(real_series):
    img = image_with([k for k in real_series.knobs() if k.name != "PB_TENSOR_PARALLEL"])
    cfg = replace(LOCAL, runtime="docker", worker="local", tp=2, knobs={"PB_TENSOR_PARALLEL": "1"})
    (row,) = preflight.knob_rows(cfg, img, "pb-1")
    assert not row.ok and row.detail == "image pb-1 has no PB_TENSOR_PARALLEL (the tensor-parallel patch)"
    assert "0200-tensor-parallel.patch" in row.fix


def test_render_repeats_each_fail_with_its_fix():
    text = preflight.render([Row("head", "docker", True, "local answers"),
                             Row("worker", "port 8000", False, "127.0.0.1:8000 is in use", "stop it")])
    assert text.splitlines()[0].split() == ["node", "check", "result", "detail"]
    assert "worker  port 8000  FAIL    127.0.0.1:8000 is in use" in text
    assert text.splitlines()[-1] == "FAIL worker port 8000: fix: stop it"


def test_detected_interfaces_come_from_the_ifname_rows():
    rows = [Row("head", "ifname", True, preflight.IFNAME_PREFIX + "eth1"),
            Row("worker", "ifname", True, preflight.IFNAME_PREFIX + "ens5 (GLOO_IFNAME=x is used)")]
    assert preflight.detected_ifnames(rows) == {"head": "eth1", "worker": "ens5"}


def test_the_prod_example_is_two_ranks_on_two_nodes():
    cfg = config.load(config.CONFIG_DIR / "prod.env.example", environ={})
    assert (cfg.runtime, cfg.world_size, cfg.worker.startswith("ssh://")) == ("docker", 2, True)

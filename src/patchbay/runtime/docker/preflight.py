"""Preflight for RUNTIME=docker: per node, PASS/FAIL rows, each FAIL with its fix.

The node checks run in throwaway containers of the serving image on the host network, so they
see what a rank will see (memory, disk, ports, interfaces, GPUs, the mounted checkpoint).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...series.knobs import Knob, KnobError
from ..config import Config
from .image import LABEL, find_image, image_tag, is_current, recipe_hash
from .nodes import Node, NodeError, nodes

MANIFEST_VOLUME = "patchbay-manifests"  # the verified-weights manifests; kept across restarts
MANIFEST_DIR = "/var/cache/patchbay-manifests"
TP_KNOB = "PB_TENSOR_PARALLEL"


@dataclass(frozen=True)
class Row:
    node: str
    check: str
    ok: bool
    detail: str
    fix: str = ""


def registry_knobs(image) -> dict[str, Knob]:
    """The knobs an image was built with, from its registry label."""
    data = json.loads(image.labels.get(f"{LABEL}.knobs", '{"knobs": {}}'))["knobs"]
    return {name: Knob(name=name, type=e["type"], default=e["default"], values=tuple(e.get("values", ())),
                       min=e.get("min"), max=e.get("max"), per_request=e.get("per_request", False))
            for name, e in data.items()}


def rank_knobs(cfg: Config) -> dict[str, str]:
    """The knobs a rank starts with (TP=2 has PB_TENSOR_PARALLEL=1 among them; config checks that)."""
    return dict(cfg.knobs)


def knob_rows(cfg: Config, image, build_id: str) -> list[Row]:
    known = registry_knobs(image)
    rows = []
    for name, raw in sorted(cfg.knobs.items()):
        knob = known.get(name)
        if knob is None and name == TP_KNOB:
            rows.append(Row("config", name, False, f"image {build_id} has no {TP_KNOB} (the tensor-parallel "
                            "patch)", "build the image from a series with 0200-tensor-parallel.patch, or set "
                            f"TP=1, no WORKER and no {TP_KNOB} line in {cfg.source}"))
        elif knob is None:
            rows.append(Row("config", name, False, f"{name} is not a knob of image {build_id} "
                            f"(known: {', '.join(sorted(known)) or 'none'})",
                            f"remove or rename the {name} line in {cfg.source}"))
        if knob is None:
            continue
        try:
            knob.parse(raw)
        except KnobError as e:
            rows.append(Row("config", name, False, str(e), f"correct the {name} line in {cfg.source}"))
    if not rows:
        rows.append(Row("config", "knobs", True, f"{len(cfg.knobs)} knob(s) valid in image {build_id}"))
    return rows


def run_probe(client, tag: str, name: str, spec: dict, model_path: str | None, detach: bool = False):
    """Run patchbay.runtime.docker.probe in a throwaway container on the node's host network."""
    import docker.errors
    import docker.types

    try:
        client.containers.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass
    mounts = [docker.types.Mount(MANIFEST_DIR, MANIFEST_VOLUME, type="volume")]
    if model_path:
        mounts.append(model_mount(model_path))
    kwargs = dict(name=name, network_mode="host", mounts=mounts, labels={f"{LABEL}.probe": "1"})
    cmd = ["python3", "-m", "patchbay.runtime.docker.probe", json.dumps(spec)]
    if detach:
        return client.containers.run(tag, cmd, detach=True, remove=True, **kwargs)
    try:
        out = client.containers.run(tag, cmd, remove=True, stderr=True, **kwargs)
    except docker.errors.ContainerError as e:
        raise NodeError(f"the preflight probe failed on the node: {(e.stderr or b'').decode()[-300:]}") from None
    except docker.errors.APIError as e:
        if model_path and "bind source path does not exist" in str(e):
            # The checkpoint folder is missing on this node: probe the rest, report the model.
            spec = {k: v for k, v in spec.items() if k != "model"}
            result = run_probe(client, tag, name, spec, None)
            result["model"] = [False, f"{model_path} does not exist on this node", {}]
            return result
        raise
    return json.loads(out.decode().strip().splitlines()[-1])


def model_mount(model_path: str):
    """The checkpoint, read-only at the same path; a bind mount (unlike -v) never creates a
    missing folder on the node."""
    import docker.types

    return docker.types.Mount(model_path, model_path, type="bind", read_only=True)


FIXES = {
    "memory": "free memory on that node, or lower MIN_MEM_GIB (or PB_HOST_TIER_MB, host memory the engine pins) "
              "in {source}",
    "disk": "make room (`docker image prune`, `docker system df`), or lower MIN_DISK_GIB in {source}",
    "gpu": "free the GPUs (nvidia-smi shows who holds them), or lower GPUS_PER_NODE / GPU_MIN_FREE_GIB",
    "address": "set {key}_ADDR in {source} to an address of that node (the one the other node reaches)",
    "model": "put the checkpoint at that path on the node (the same files as on the head), or fix MODEL "
             "in {source}",
}


def _probe_rows(node: Node, result: dict, cfg: Config) -> list[Row]:
    rows = []
    for check, (ok, detail, *_) in result.items():
        if check.startswith("port"):
            fix = (f"stop what listens there (`ss -ltnp 'sport = :{check.split()[1]}'`), or change "
                   f"{'PORT' if check == f'port {cfg.port}' else 'RDZV_PORT'} in {cfg.source}")
        elif check.startswith("interface"):
            fix = f"set GLOO_IFNAME / NCCL_IFNAME in {cfg.source} to an interface of the {node.role}"
        else:
            fix = FIXES.get(check, "").format(source=cfg.source, key=node.key)
        rows.append(Row(node.role, check, ok, detail, "" if ok else fix))
    return rows


def _ifname_detail(cfg: Config, found: str) -> str:
    return f"{IFNAME_PREFIX}{found}" + ("" if not cfg.gloo_ifname else f" (GLOO_IFNAME={cfg.gloo_ifname} is used)")


IFNAME_PREFIX = "the rendezvous address is on "


def detected_ifnames(rows: list[Row]) -> dict[str, str]:
    """role -> the interface holding that node's address, as preflight found it."""
    return {r.node: r.detail[len(IFNAME_PREFIX):].split()[0] for r in rows
            if r.check == "ifname" and r.detail.startswith(IFNAME_PREFIX)}


def _reach(listener: Node, lclient, dialer: Node, dclient, tag: str, cfg: Config) -> Row:
    """Whether dialer reaches listener's rendezvous port (a short listener stands in for the rank)."""
    name = f"{cfg.pair}-probe-listen"
    box = run_probe(lclient, tag, name, {"listen": [cfg.rdzv_port, 30]}, None, detach=True)
    try:
        for _ in range(50):
            if b"listening" in box.logs():
                break
            import time

            time.sleep(0.2)
        result = run_probe(dclient, tag, f"{cfg.pair}-probe-dial", {"connect": [listener.addr, cfg.rdzv_port, 8]},
                           None)
    finally:
        try:
            box.remove(force=True)
        except Exception:  # it may have gone already
            pass
    ok, detail = result["peer"]
    return Row(dialer.role, f"reach {listener.role}", ok, detail, "" if ok else
               f"open TCP {cfg.rdzv_port} from the {dialer.role} to {listener.addr} (firewall), and check "
               f"{listener.key}_ADDR / GLOO_IFNAME in {cfg.source}")


def preflight(cfg: Config, build_id: str, model_path: str) -> list[Row]:
    rows: list[Row] = []
    tag = image_tag(build_id)
    clients = {}
    for node in nodes(cfg):
        try:
            clients[node.role] = node.client()
            rows.append(Row(node.role, "docker", True, f"{node.endpoint} answers"))
        except NodeError as e:
            rows.append(Row(node.role, "docker", False, str(e).split(": ", 1)[1].split(";")[0],
                            "start dockerd (scripts/dockerd.sh), or check ssh access and the docker group"))
    images = {}
    for node in nodes(cfg):
        client = clients.get(node.role)
        if client is None:
            continue
        found = find_image(client, tag)
        ok = is_current(found, build_id)
        if ok:
            images[node.role] = found
        detail = f"no {tag}" if found is None else \
            f"{tag} (build {found.labels.get(f'{LABEL}.build')}, recipe {found.labels.get(f'{LABEL}.recipe')})"
        rows.append(Row(node.role, "image", ok, detail + ("" if ok or found is None else
                                                          f"; this checkout makes recipe {recipe_hash()}"),
                        "" if ok else "scripts/serve.sh build (builds on the head, copies to the worker)"))
    if "head" in images:
        rows += knob_rows(cfg, images["head"], build_id)
    manifests = {}
    for node in nodes(cfg):
        if node.role not in images:
            continue
        spec: dict = {"mem_gib": cfg.mem_gib_needed, "disk_gib": cfg.min_disk_gib,
                      "ifnames": [n for n in dict.fromkeys((cfg.gloo_ifname, cfg.nccl_ifname)) if n],
                      "model": {"path": model_path, "cache": MANIFEST_DIR}}
        if cfg.world_size > 1:
            spec["addr"] = node.addr
        if node.rank == 0:
            spec["ports"] = [[cfg.host, cfg.port]] + ([["0.0.0.0", cfg.rdzv_port]] if cfg.world_size > 1 else [])
        if cfg.gpus_per_node:
            spec["gpus"] = {"count": cfg.gpus_per_node, "min_free_gib": cfg.gpu_min_free_gib}
        try:
            result = run_probe(clients[node.role], tag, f"{cfg.pair}-probe-{node.role}", spec, model_path)
        except NodeError as e:
            rows.append(Row(node.role, "probe", False, str(e), "read the message; the image may be broken"))
            continue
        rows += _probe_rows(node, result, cfg)
        if result.get("address", [False])[0]:
            rows.append(Row(node.role, "ifname", True, _ifname_detail(cfg, result["address"][2]["ifname"])))
        if result.get("model", [False])[0]:
            manifests[node.role] = result["model"][2]["manifest"]
    if len(manifests) == 2 and manifests["head"] != manifests["worker"]:
        rows.append(Row("worker", "same model", False, f"manifest {manifests['worker']} differs from the "
                        f"head's {manifests['head']}", f"copy the head's {model_path} to the worker (rsync -a)"))
    ns = nodes(cfg)
    if len(ns) == 2 and len(images) == 2 and all(r.ok for r in rows if r.check.startswith("port")):
        head, worker = ns
        rows.append(_reach(head, clients["head"], worker, clients["worker"], tag, cfg))
        rows.append(_reach(worker, clients["worker"], head, clients["head"], tag, cfg))
    return rows


def render(rows: list[Row]) -> str:
    width = max(len(r.check) for r in rows)
    nodew = max(len(r.node) for r in rows)
    out = [f"{'node':<{nodew}}  {'check':<{width}}  result  detail"]
    for r in rows:
        out.append(f"{r.node:<{nodew}}  {r.check:<{width}}  {'PASS' if r.ok else 'FAIL'}    {r.detail}")
    fails = [r for r in rows if not r.ok]
    if fails:
        out.append("")
        out += [f"FAIL {r.node} {r.check}: fix: {r.fix}" for r in fails]
    return "\n".join(out)

"""start / stop / status / logs / watch for RUNTIME=docker: rank 0 on the head (HTTP), rank 1 on
the worker, host networking, tensor parallel over torch.distributed (gloo on CPU, nccl on GPU).

Everything about a running pair lives in its containers' labels, so status, stop and the
watchdog work from any shell on the head, and a restart reads the same config file again.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass

from .. import procenv
from ..config import Config
from ..launch import LaunchError, first_streamed_token, health
from .image import LABEL, image_tag
from .nodes import Node, NodeError, nodes
from .preflight import model_mount, rank_knobs


@dataclass
class Rank:
    node: Node
    client: object
    container: object | None  # None: no container of this pair on that node

    @property
    def name(self) -> str:
        return self.container.name if self.container is not None else "-"

    @property
    def state(self) -> str:
        if self.container is None:
            return "missing"
        self.container.reload()
        st = self.container.attrs["State"]
        return st["Status"] if st["Status"] != "exited" else f"exited ({st['ExitCode']})"


def container_name(cfg: Config, rank: int) -> str:
    return f"{cfg.pair}-rank{rank}"


def _get(client, name: str):
    import docker.errors

    try:
        return client.containers.get(name)
    except docker.errors.NotFound:
        return None


def ranks(cfg: Config) -> list[Rank]:
    out = []
    for node in nodes(cfg):
        client = node.client(timeout=30)
        out.append(Rank(node, client, _get(client, container_name(cfg, node.rank))))
    return out


def rank_env(cfg: Config, rank: int, ifname: str = "") -> dict[str, str]:
    """A rank's torch.distributed environment; ifname (the interface holding the node's address,
    found by preflight) stands in for GLOO_IFNAME / NCCL_IFNAME left empty."""
    env = {**rank_knobs(cfg), **procenv.rank(rank, cfg.world_size, cfg.head_addr, cfg.rdzv_port, local_rank=0)}
    if cfg.world_size > 1:
        for key, value in (("GLOO_SOCKET_IFNAME", cfg.gloo_ifname), ("NCCL_SOCKET_IFNAME", cfg.nccl_ifname)):
            if value or ifname:
                env[key] = value or ifname
    return env


# Triton's compiled kernels, in a Docker volume of each node so a restarted or rebuilt rank finds
# them: a container's own cache starts empty, and on an H200 a server spent 10-30 s compiling
# during its first batched steps, each step's requests waiting (W15 traces). Triton keys
# its cache by kernel source and compiler, so builds share the volume safely;
# `docker volume rm patchbay-kernel-cache` clears it.
KERNEL_CACHE_VOLUME = "patchbay-kernel-cache"
KERNEL_CACHE_DIR = "/var/cache/patchbay/triton"


def rank_command(cfg: Config, model_path: str) -> list[str]:
    cmd = ["python3", "-m", "transformers.cli.transformers", "serve", model_path, "--host", cfg.host,
           "--port", str(cfg.port), "--device", cfg.device, "--log-level", "info"]
    if cfg.continuous_batching:
        cmd.append("--continuous-batching")
    return cmd + cfg.engine_args.split()


def tail(container, lines: int = 15) -> str:
    """The last lines of a rank's log, after the last error lines above them (a usage error or a
    traceback's first line is often followed by a long listing)."""
    try:
        text = container.logs(tail=400).decode(errors="replace").rstrip()
    except Exception as e:  # the container may be gone already
        return f"    (no log: {type(e).__name__})"
    all_lines = text.splitlines()
    last = all_lines[-lines:]
    errors = [l for l in all_lines[:-lines] if re.search(r"\bError\b|Traceback|error:", l)][-3:]
    shown = errors + (["..."] if errors else []) + last
    return "\n".join("    " + l for l in shown) or "    (empty log)"


def _remove(rs: list[Rank]) -> list[str]:
    removed = []
    for r in rs:
        if r.container is not None:
            try:
                r.container.remove(force=True)
                removed.append(r.container.name)
            except Exception:  # already gone: that is what we want
                pass
            r.container = None
    return removed


def start(cfg: Config, build_id: str, model_path: str, config_text: str, progress=print,
          ifnames: dict | None = None) -> dict:
    """Start both ranks; on any failure or a readiness timeout remove both and raise with the last
    log lines of each. Ready = a streamed token came back through the head."""
    import docker
    import docker.errors
    import docker.types

    rs = ranks(cfg)
    live = [r for r in rs if r.container is not None]
    if any(r.state == "running" for r in live):
        raise LaunchError(f"already running ({', '.join(r.name for r in live)}); run `scripts/serve.sh stop` first")
    _remove(live)  # leftovers of a pair that died
    tag = image_tag(build_id)
    started = int(time.time())
    info = {"url": cfg.url, "build_id": build_id, "model": model_path,
            "served_as": cfg.served_names(model_path), "knobs": dict(sorted(rank_knobs(cfg).items())),
            "config": cfg.source, "world_size": cfg.world_size, "started": started}
    # PB_AUTH: the key files, read-only at the same paths inside rank 0's container (it serves HTTP).
    http_env = cfg.engine_http_env()
    key_mounts = [docker.types.Mount(path, path, type="bind", read_only=True)
                  for key, path in http_env.items() if key.endswith("_KEY_FILE")]
    for r in rs:
        kwargs = {}
        if cfg.gpus_per_node:
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=cfg.gpus_per_node, capabilities=[["gpu"]])]
        try:
            r.container = r.client.containers.run(
                tag, rank_command(cfg, model_path), name=container_name(cfg, r.node.rank), detach=True,
                network_mode="host", ipc_mode="host",
                environment={**rank_env(cfg, r.node.rank, (ifnames or {}).get(r.node.role, "")),
                             "TRITON_CACHE_DIR": KERNEL_CACHE_DIR, **(http_env if r.node.rank == 0 else {})},
                mounts=[model_mount(model_path), docker.types.Mount(KERNEL_CACHE_DIR, KERNEL_CACHE_VOLUME, type="volume"),
                        *(key_mounts if r.node.rank == 0 else [])],
                labels={f"{LABEL}.pair": cfg.pair, f"{LABEL}.rank": str(r.node.rank),
                        f"{LABEL}.info": json.dumps(info), f"{LABEL}.config-text": config_text},
                **kwargs)
        except docker.errors.APIError as e:
            _remove(rs)
            raise LaunchError(f"rank {r.node.rank} on the {r.node.role} did not start: {e.explanation or e}") from None
    progress(f"waiting for the first streamed token from {cfg.url} ({cfg.world_size} rank(s))")
    deadline = time.monotonic() + cfg.ready_timeout
    while time.monotonic() < deadline:
        for r in rs:
            state = r.state
            if state != "running":
                logs = "\n".join(f"  rank {x.node.rank} ({x.node.role}, {x.state}):\n{tail(x.container)}" for x in rs)
                _remove(rs)
                raise LaunchError(f"rank {r.node.rank} on the {r.node.role} exited before the pair was ready "
                                  f"({state}); both removed; last log lines:\n{logs}")
        if first_streamed_token(cfg.url, model_path, headers=cfg.auth_headers()):
            return info
        time.sleep(1.0)
    logs = "\n".join(f"  rank {x.node.rank} ({x.node.role}):\n{tail(x.container)}" for x in rs)
    _remove(rs)
    raise LaunchError(f"no streamed token within {cfg.ready_timeout}s (READY_TIMEOUT); both ranks removed; "
                      f"last log lines:\n{logs}")


def stop(cfg: Config) -> list[str]:
    """Remove the pair's containers on every node (and any probe left over)."""
    removed = []
    for node in nodes(cfg):
        client = node.client(timeout=60)
        names = [container_name(cfg, node.rank)] + [f"{cfg.pair}-probe-{s}" for s in
                                                    ("head", "worker", "listen", "dial")]
        for name in names:
            c = _get(client, name)
            if c is not None:
                c.remove(force=True)
                removed.append(f"{name} on the {node.role}")
    return removed


def status(cfg: Config) -> tuple[int, list[tuple[str, str]], list[list[str]]]:
    """(exit code, summary rows, per-rank rows). 0: all ranks up and healthy; 1: degraded; 3: none."""
    rows = []
    info = {}
    rs = []
    for node in nodes(cfg):
        try:
            client = node.client(timeout=10)
        except NodeError as e:
            rows.append([str(node.rank), node.role, "-", "unreachable", str(e)[:60]])
            continue
        r = Rank(node, client, _get(client, container_name(cfg, node.rank)))
        rs.append(r)
        own = json.loads(r.container.labels.get(f"{LABEL}.info", "{}")) if r.container is not None else {}
        info = info or own
        rows.append([str(node.rank), node.role, r.name, r.state, own.get("build_id", "-")])
    if not any(r.container is not None for r in rs):
        return 3, [], rows
    up = all(row[3] == "running" for row in rows)
    head_up = any(r.node.rank == 0 and r.state == "running" for r in rs)
    h = health(cfg.url, headers=cfg.auth_headers()) if head_up else "head not running"
    summary = [("url", info.get("url", cfg.url)), ("build", info.get("build_id", "-")), ("model", info.get("model", "-")),
               ("model id", info.get("served_as", info.get("model", "-"))), ("context", _context(info.get("model", ""))), ("config", info.get("config", "-")),
               ("ranks", str(info.get("world_size", "-"))),
               ("knobs on", ", ".join(f"{k}={v}" for k, v in info.get("knobs", {}).items()) or "none"),
               ("up", f"{int(time.time()) - info.get('started', int(time.time()))}s"), ("health", h)]
    return (0 if up and h == "ok" else 1), summary, rows


def _context(model_path: str) -> str:
    from pathlib import Path

    try:
        cfg = json.loads((Path(model_path) / "config.json").read_text())
        return f"{cfg.get('max_position_embeddings', '?')} tokens"
    except (OSError, ValueError):
        return "?"


def logs(cfg: Config, rank: int, lines: int, follow: bool, write) -> None:
    ns = [n for n in nodes(cfg) if n.rank == rank]
    if not ns:
        raise LaunchError(f"no rank {rank} in {cfg.source} (ranks: 0-{cfg.world_size - 1})")
    c = _get(ns[0].client(timeout=30), container_name(cfg, rank))
    if c is None:
        raise LaunchError(f"no container {container_name(cfg, rank)} on the {ns[0].role}; start the pair first")
    if not follow:
        write(c.logs(tail=lines).decode(errors="replace"))
        return
    for chunk in c.logs(stream=True, follow=True, tail=lines):
        write(chunk.decode(errors="replace"))

"""Where things run: the head and the worker of RUNTIME=docker, each a Docker endpoint.

A node is `local` (this machine's Docker engine) or `ssh://user@host` (that machine's engine,
reached through the host's own ssh client, so its keys and known_hosts apply).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Config


class NodeError(RuntimeError):
    """A node that cannot be used, worded for the operator."""


@dataclass(frozen=True)
class Node:
    role: str  # head or worker
    rank: int
    endpoint: str  # local or ssh://user@host
    addr: str  # the address the other node reaches this one on

    @property
    def key(self) -> str:
        return self.role.upper()

    def client(self, timeout: int = 600):
        """A Docker SDK client for this node; NodeError when its engine does not answer."""
        import docker
        import docker.errors

        try:
            if self.endpoint == "local":
                client = docker.from_env(timeout=timeout)
            else:
                client = docker.DockerClient(base_url=self.endpoint, use_ssh_client=True, timeout=timeout)
            client.ping()
            return client
        except docker.errors.DockerException as e:
            where = "this machine" if self.endpoint == "local" else self.endpoint
            detail = str(e).splitlines()[0][:160]
            raise NodeError(f"{self.key}: Docker on {where} does not answer ({detail}); start dockerd "
                            "(scripts/dockerd.sh), or check ssh access and that the user may use docker") from None

    def same_engine_as(self, other: "Node") -> bool:
        return self.endpoint == other.endpoint


def nodes(cfg: Config) -> list[Node]:
    """The ranks of cfg in order: the head (rank 0), then the worker if there is one."""
    out = [Node("head", 0, cfg.head, cfg.head_addr)]
    if cfg.worker:
        out.append(Node("worker", 1, cfg.worker, cfg.worker_addr))
    return out

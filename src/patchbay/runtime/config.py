"""The one settings object: read from a `.env` file, overridable from the environment.

A config file holds `KEY=VALUE` lines. Plain keys are patchbay's settings (the fields of
`Config`); `KNOBS=NAME` starts from a named knob set of config/knob-sets.toml (minimal, local,
prod), and `PB_*` keys set single engine knobs over it, checked against the series' registry.
In the environment, `PATCHBAY_<KEY>` overrides `<KEY>` from the file (a bare HOST or PORT in
a shell is too common to trust); knobs come from the file only.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path

from .. import ROOT

CONFIG_DIR = ROOT / "config"
KNOB_SETS = CONFIG_DIR / "knob-sets.toml"
_SSH_RE = re.compile(r"ssh://[A-Za-z0-9_.-]+@[A-Za-z0-9_.-]+(:\d+)?")
_HOST_RE = re.compile(r"[A-Za-z0-9_.:-]{1,253}")
# The models a config may name without a path: written on first use (runtime/models.py).
SYNTHETIC_MODELS = ("synthetic:tiny", "synthetic:trained", "synthetic:trained-fp8")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")  # as engine/_pb/api/served.py accepts


class ConfigError(ValueError):
    """One line for the operator: which file, which key, what is allowed."""


@dataclass(frozen=True)
class Config:
    model: str = "synthetic:tiny"  # one of SYNTHETIC_MODELS, or a local checkpoint folder
    host: str = "127.0.0.1"
    port: int = 8000
    runtime: str = "local"  # local: a process on this machine; docker: containers on HEAD (and WORKER)
    device: str = "cpu"  # passed to `transformers serve --device`
    continuous_batching: bool = True
    synth_seed: int = 0
    # MODEL=synthetic:tiny's (and trained's) context in tokens (its max_position_embeddings and the tokenizer's
    # model_max_length; no weight depends on it). Coding agents send 10K-30K tokens at once.
    synth_context: int = 65536
    ready_timeout: int = 600  # seconds for the first streamed token after start
    engine_args: str = ""  # extra `transformers serve` flags, space-separated
    tp: int = 1  # tensor-parallel ranks; > 1 needs PB_TENSOR_PARALLEL=1 (local: all ranks on this machine)
    rdzv_port: int = 29500  # torch.distributed rendezvous port on rank 0's host (MASTER_PORT)
    run_dir: str = ".run"  # pid, log and state of the running server (relative to the repo)
    # RUNTIME=docker: where the ranks run (`local`, or `ssh://user@host` through the Docker SDK),
    # the addresses the ranks reach each other on (the rendezvous port is RDZV_PORT), and what
    # each node must have.
    head: str = "local"
    worker: str = ""  # empty: one rank on the head only
    head_addr: str = "127.0.0.1"  # MASTER_ADDR: the head's address as the worker reaches it
    worker_addr: str = "127.0.0.1"  # the worker's address as the head reaches it
    gloo_ifname: str = ""  # GLOO_SOCKET_IFNAME on both nodes (empty: gloo picks)
    nccl_ifname: str = ""  # NCCL_SOCKET_IFNAME on both nodes (empty: nccl picks)
    gpus_per_node: int = 0  # GPUs each rank needs (0: CPU)
    gpu_min_free_gib: int = 0  # free memory each of those GPUs must have
    min_mem_gib: int = 2  # MemAvailable each node must have
    min_disk_gib: int = 5  # free space under Docker's data root on each node
    pair: str = "patchbay"  # container names: <PAIR>-rank0, <PAIR>-rank1
    base_image: str = ""  # empty: the offline base `patchbay base-image` makes
    extra_ca_bundle: str = ""  # PEM file added to the image's CA bundle (TLS-intercepting proxies)
    # PB_AUTH=1: the bearer key clients must send, as a file holding it (first line), on the head;
    # the admin routes' key likewise (empty: /load_model and /reset answer 404). A HOST other
    # than loopback needs a key unless ALLOW_UNAUTHENTICATED=1.
    api_key_file: str = ""
    admin_key_file: str = ""
    allow_unauthenticated: bool = False
    # PB_SERVED_NAMES=1: the names clients send as `model` (comma-separated; the first is the one
    # replies carry). Empty: the checkpoint folder's name.
    served_model_name: str = ""
    knob_set: str = ""  # KNOBS: the named set the knobs start from (config/knob-sets.toml); empty: none
    knobs: dict = field(default_factory=dict)  # PB_* name -> raw value: the set's, then the file's PB_* lines
    source: str = "defaults"

    def __post_init__(self):
        where = self.source
        if self.runtime not in ("local", "docker"):
            raise ConfigError(f"{where}: RUNTIME={self.runtime} is not supported (allowed: local, docker)")
        for key, value, empty_ok in (("HEAD", self.head, False), ("WORKER", self.worker, True)):
            if not (value == "local" or (empty_ok and value == "") or _SSH_RE.fullmatch(value)):
                raise ConfigError(f"{where}: {key}={value} is not a node (allowed: local, ssh://user@host"
                                  + (", or empty for one node)" if empty_ok else ")"))
        for key, value in (("HEAD_ADDR", self.head_addr), ("WORKER_ADDR", self.worker_addr)):
            if not _HOST_RE.fullmatch(value):
                raise ConfigError(f"{where}: {key}={value} is not an IP address or host name")
        for key, value in (("GLOO_IFNAME", self.gloo_ifname), ("NCCL_IFNAME", self.nccl_ifname)):
            if value and not re.fullmatch(r"[A-Za-z0-9_.:@-]{1,15}", value):
                raise ConfigError(f"{where}: {key}={value} is not a network interface name (e.g. eth0)")
        if self.runtime == "docker" and (self.tp > 2 or (self.tp == 2) != bool(self.worker)):
            raise ConfigError(f"{where}: RUNTIME=docker runs one rank per node: TP=2 with a WORKER, or TP=1 "
                              f"without one (got TP={self.tp}, WORKER={self.worker or 'empty'})")
        for key, value in (("GPUS_PER_NODE", self.gpus_per_node), ("GPU_MIN_FREE_GIB", self.gpu_min_free_gib),
                           ("MIN_MEM_GIB", self.min_mem_gib), ("MIN_DISK_GIB", self.min_disk_gib)):
            if value < 0:
                raise ConfigError(f"{where}: {key}={value} must be 0 or more")
        if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,40}", self.pair):
            raise ConfigError(f"{where}: PAIR={self.pair} must be a container name prefix (a-z, 0-9, _ . -)")
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"{where}: PORT={self.port} is out of range (allowed: 1-65535)")
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            if self.host != "localhost":
                raise ConfigError(f"{where}: HOST={self.host} is not an IP address (e.g. 127.0.0.1)") from None
        if not 128 <= self.synth_context <= 1 << 20:
            raise ConfigError(f"{where}: SYNTH_CONTEXT={self.synth_context} is out of range (allowed: 128-1048576 tokens)")
        if self.ready_timeout < 1:
            raise ConfigError(f"{where}: READY_TIMEOUT={self.ready_timeout} must be at least 1 (seconds)")
        if not 1 <= self.tp <= 8:
            raise ConfigError(f"{where}: TP={self.tp} is out of range (allowed: 1-8)")
        if not 1 <= self.rdzv_port <= 65535 or self.rdzv_port == self.port:
            raise ConfigError(f"{where}: RDZV_PORT={self.rdzv_port} must be a port (1-65535) other than PORT")
        tp_knob = self.knobs.get("PB_TENSOR_PARALLEL", "0") == "1"
        if self.tp > 1 and not tp_knob:
            raise ConfigError(f"{where}: TP={self.tp} needs PB_TENSOR_PARALLEL=1 (the engine's tensor-parallel patch)")
        if tp_knob and self.tp == 1:
            raise ConfigError(f"{where}: PB_TENSOR_PARALLEL=1 needs TP=2 or more (or unset the knob)")
        if self.tp > 1 and not self.continuous_batching:
            raise ConfigError(f"{where}: TP={self.tp} needs CONTINUOUS_BATCHING=1 (ranks > 0 follow rank 0's batches)")
        auth_knob = self.knobs.get("PB_AUTH", "0") == "1"
        for key, value in (("API_KEY_FILE", self.api_key_file), ("ADMIN_KEY_FILE", self.admin_key_file)):
            if value and not auth_knob:
                raise ConfigError(f"{where}: {key} needs PB_AUTH=1 (the engine's key check), or remove the line")
            if value and not value.startswith("/"):
                raise ConfigError(f"{where}: {key}={value} must be an absolute path")
        if self.served_model_name:
            if self.knobs.get("PB_SERVED_NAMES", "0") != "1":
                raise ConfigError(f"{where}: SERVED_MODEL_NAME needs PB_SERVED_NAMES=1 (the engine's served names), "
                                  "or remove the line")
            for name in self.served_model_name.split(","):
                if not _NAME_RE.fullmatch(name.strip()):
                    raise ConfigError(f"{where}: SERVED_MODEL_NAME={self.served_model_name}: {name.strip()!r} is not a "
                                      "model name (allowed: comma-separated names of letters, digits and ._:/@+-, "
                                      "each starting with a letter or digit)")
        if not self.loopback and not self.api_key_file and not self.allow_unauthenticated:
            raise ConfigError(f"{where}: HOST={self.host} is reachable from other machines but no key is set: set "
                              "API_KEY_FILE=/path/to/key (with PB_AUTH=1), or ALLOW_UNAUTHENTICATED=1 to serve "
                              "without one")
        if not (self.model in SYNTHETIC_MODELS or self.model.startswith("/") or self.model.startswith(".")):
            raise ConfigError(f"{where}: MODEL={self.model} must be {', '.join(SYNTHETIC_MODELS)} or a local "
                              "checkpoint folder (an absolute path, or one starting with ./)")

    @property
    def run_path(self) -> Path:
        return ROOT / self.run_dir

    @property
    def source_path(self) -> Path:
        """The file this config was read from, to read it again (`source` is relative to ROOT)."""
        return ROOT / self.source

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def loopback(self) -> bool:
        return self.host == "localhost" or ipaddress.ip_address(self.host).is_loopback

    def api_key(self) -> str | None:
        """The bearer key clients send (None: no key), read from API_KEY_FILE."""
        if not self.api_key_file:
            return None
        try:
            key = Path(self.api_key_file).read_text().splitlines()[0].strip()
        except (OSError, IndexError):
            raise ConfigError(f"{self.source}: API_KEY_FILE={self.api_key_file} cannot be read or is empty") from None
        return key or None

    def auth_headers(self) -> dict[str, str]:
        """The headers patchbay's own probes send (health, the first streamed token)."""
        key = self.api_key()
        return {"Authorization": f"Bearer {key}"} if key else {}

    def engine_http_env(self) -> dict[str, str]:
        """What the HTTP rank's environment gets: for PB_AUTH the key files' paths, for
        PB_SERVED_NAMES the names."""
        env = {}
        if self.served_model_name:
            env["SERVED_MODEL_NAME"] = self.served_model_name
        if self.api_key_file:
            env["API_KEY_FILE"] = self.api_key_file
        if self.admin_key_file:
            env["ADMIN_KEY_FILE"] = self.admin_key_file
        return env

    def served_names(self, model_path: str) -> str:
        """What clients send as `model`: the served names (PB_SERVED_NAMES) or the path."""
        if self.knobs.get("PB_SERVED_NAMES", "0") != "1":
            return model_path
        return self.served_model_name or model_path.split("@", 1)[0].rstrip("/").rsplit("/", 1)[-1]

    @property
    def mem_gib_needed(self) -> int:
        """MemAvailable a node must have: MIN_MEM_GIB, plus the pinned host memory 0790's
        PB_HOST_TIER_MB takes when the engine starts (each rank its own)."""
        return self.min_mem_gib + -(-int(self.knobs.get("PB_HOST_TIER_MB") or 0) // 1024)

    @property
    def world_size(self) -> int:
        return self.tp

    def knobs_on(self) -> dict:
        return dict(sorted(self.knobs.items()))


_SETTINGS = {f.name.upper(): f for f in fields(Config) if f.name not in ("knobs", "source", "knob_set")}


def knob_sets(path: Path = KNOB_SETS) -> dict[str, dict[str, str]]:
    """Every named knob set: name -> {PB_* name: raw value}, bases resolved."""
    where = path.name
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing; it defines the named knob sets") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML: {e}") from None
    resolved: dict[str, dict[str, str]] = {}

    def resolve(name: str, seen: tuple[str, ...]) -> dict[str, str]:
        if name in resolved:
            return resolved[name]
        if name in seen:
            raise ConfigError(f"{where}: [{name}] is its own base (through {' -> '.join(seen)})")
        table = data[name]
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: {name} must be a [table] of PB_* knobs")
        base = table.get("base")
        if base is not None and base not in data:
            raise ConfigError(f"{where}: [{name}] base = {base!r} is not a set (sets: {', '.join(data)})")
        knobs = dict(resolve(base, (*seen, name))) if base else {}
        for knob in table.get("unset", []):
            if knob not in knobs:
                raise ConfigError(f"{where}: [{name}] unsets {knob}, which its base does not set")
            del knobs[knob]
        for key, value in table.items():
            if key in ("base", "unset"):
                continue
            if not key.startswith("PB_") or not isinstance(value, str):
                raise ConfigError(f"{where}: [{name}] {key} = {value!r}: a set holds PB_* knobs with string "
                                  "values (PB_X = \"1\"), base and unset")
            knobs[key] = value
        resolved[name] = knobs
        return knobs

    for name in data:
        resolve(name, ())
    return resolved


def knob_set(name: str) -> dict[str, str]:
    """One named set's knobs, or ConfigError naming the sets there are."""
    sets = knob_sets()
    if name not in sets:
        raise ConfigError(f"KNOBS={name} is not a knob set (allowed: {', '.join(sets)}; config/knob-sets.toml)")
    return dict(sets[name])


def _convert(key: str, raw: str, where: str):
    kind = _SETTINGS[key].type
    if kind == "int":
        if not re.fullmatch(r"-?\d+", raw):  # int() would also take "1_000" and " 8000"
            raise ConfigError(f"{where}: {key}={raw} is not an integer")
        return int(raw)
    if kind == "bool":
        if raw not in ("0", "1"):
            raise ConfigError(f"{where}: {key}={raw} is not a valid value (allowed: 0, 1)")
        return raw == "1"
    return raw


def parse_env_file(path: Path) -> dict[str, str]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file; copy config/local.env.example to start from") from None
    values: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, eq, value = stripped.partition("=")
        key, value = key.strip(), value.strip()
        if not value.startswith(("'", '"')):
            value = re.split(r"\s+#", value, maxsplit=1)[0]  # `PB_X=1  # why` keeps only 1
        if not eq or not key or " " in key:
            raise ConfigError(f"{path}:{n}: expected KEY=VALUE, got {stripped[:60]!r}")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        if key in values:
            raise ConfigError(f"{path}:{n}: {key} is set twice")
        values[key] = value
    return values


def default_path() -> Path:
    local = CONFIG_DIR / "local.env"
    return local if local.is_file() else CONFIG_DIR / "local.env.example"


def load(path: Path | None = None, environ: dict | None = None) -> Config:
    path = Path(path) if path else default_path()
    environ = os.environ if environ is None else environ
    raw = parse_env_file(path)
    # resolve() first: a relative --config path is relative to the cwd, not to ROOT.
    where = str(path.resolve().relative_to(ROOT)) if ROOT in path.resolve().parents else str(path)
    kwargs: dict = {}
    knobs: dict[str, str] = {}
    if raw.get("KNOBS"):
        try:
            knobs = knob_set(raw["KNOBS"])
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
    for key, value in raw.items():
        if key.startswith("PB_"):
            knobs[key] = value
        elif key == "KNOBS":  # like the knobs themselves, from the file only
            kwargs["knob_set"] = value
        elif key in _SETTINGS:
            kwargs[_SETTINGS[key].name] = _convert(key, value, where)
        else:
            allowed = ", ".join(sorted([*_SETTINGS, "KNOBS"]))
            raise ConfigError(f"{where}: unknown setting {key} (allowed: {allowed}, and PB_* knobs)")
    overridden = []
    for key in _SETTINGS:
        override = environ.get(f"PATCHBAY_{key}")
        if override is not None:
            kwargs[_SETTINGS[key].name] = _convert(key, override, f"environment PATCHBAY_{key}")
            overridden.append(f"PATCHBAY_{key}")
    try:
        return Config(**kwargs, knobs=knobs, source=where)
    except ConfigError as e:
        if not overridden:
            raise
        # The bad value may come from the environment, not the file the message names.
        raise ConfigError(f"{e} (with {', '.join(overridden)} from the environment)") from None

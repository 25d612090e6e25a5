"""Shared fixtures for the engine tier: built engines, the tiny model, live servers.

Servers are started through patchbay's own launcher (ready = a streamed token) on free
loopback ports, each with its own run folder, and stopped when their scope ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import socket
from pathlib import Path

import pytest

from patchbay import ROOT
from patchbay.runtime import config, launch
from patchbay.series import build, series


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_handed_out: set[int] = set()


def metric(server, name: str) -> float:
    """An unlabelled sample of the server's /metrics (-1 where it has none)."""
    import httpx

    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else -1.0


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range. A port the kernel handed out
    (bind to 0) can be taken again by any outgoing connection (gloo opens many) before the
    server binds it; one below that range only by another listener. Never a config's default
    rendezvous port: a config whose PORT is its RDZV_PORT is refused."""
    rng = random.Random()  # seeded from the OS: concurrent test runs spread out
    floor = _ephemeral_floor()
    reserved = {config.Config.rdzv_port}
    for _ in range(500):
        port = rng.randint(max(1024, floor - 12000), floor - 1)
        if port in _handed_out or port in reserved:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


# Tiers follow the fixtures a test uses, so a test cannot land in a tier it does not belong to:
# a built engine (a wheel build, tens of seconds the first time) marks it `build`; the tiny model,
# the trained one (its install, seconds) or a live server marks it `engine` too. What carries no tier marker is `quick`.
BUILD_FIXTURES = {"patched_engine", "pristine_engine"}
ENGINE_FIXTURES = {"tiny_model", "trained_model", "server_on", "server_off", "server_pristine"}
TIERS = ("engine", "docker", "build", "gpu")


@pytest.hookimpl(tryfirst=True)  # before pytest's own -m selection reads the markers
def pytest_collection_modifyitems(config, items):
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & BUILD_FIXTURES:
            item.add_marker(pytest.mark.build)
        if used & ENGINE_FIXTURES:
            item.add_marker(pytest.mark.engine)
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.quick)


@pytest.fixture(scope="session", autouse=True)
def empty_hf_home(tmp_path_factory):
    # Engines must not see whatever Hugging Face cache this machine happens to have.
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf-home"))


@pytest.fixture(scope="session")
def real_series() -> series.Series:
    loaded, problems = series.load()
    assert not problems, problems
    return loaded


@pytest.fixture(scope="session")
def patched_engine(real_series) -> build.Engine:
    return build.build(real_series, progress=lambda *_: None)


@pytest.fixture(scope="session")
def pristine_engine() -> build.Engine:
    return build.build(None, progress=lambda *_: None)


@pytest.fixture(scope="session")
def trained_model() -> str:
    """synthetic:trained at the default config's context, where `MODEL=synthetic:trained` serves it:
    the shipped checkpoint, installed into .cache/models (seconds)."""
    from patchbay.runtime import trained
    from patchbay.runtime.models import trained_path

    assert trained.shipped_record() is not None, f"no shipped synthetic:trained in {trained.SHIPPED}"
    return str(trained.write_trained(trained_path(0, LOCAL.synth_context), seed=0, context=LOCAL.synth_context))


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """synthetic:tiny at the test model's small context (synth.TINY_CONTEXT), not the default's."""
    from patchbay.runtime import synth  # torch and transformers: only for the tests that need a model
    from patchbay.runtime.models import tiny_path

    return str(synth.write_tiny(tiny_path(0, synth.TINY_CONTEXT), seed=0))


# A job under Triton's interpreter (TRITON_INTERPRET=1) checks kernels' bits, a row alone against
# batched: torch's vectorized CPU kernels (AVX2 on an AMD EPYC) gave the tiny model's row other
# bits among other rows (a reduction's order follows the row count), its plain kernels did not;
# and tests/interpreter/sitecustomize.py makes the interpreter's dot independent of OpenBLAS's
# kernels in the same way (INTERPRETER_PATH goes first on such a job's PYTHONPATH).
INTERPRETER_ENV = {"ATEN_CPU_CAPABILITY": "default"}
INTERPRETER_PATH = Path(__file__).with_name("interpreter")


def engine_environ(engine: build.Engine, **env: str) -> dict[str, str]:
    """This process's environment with `engine` first on the path and no PB_* variables but those
    in `env` (and INTERPRETER_ENV under Triton's interpreter)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}
    path = [str(engine.site)]
    if env.get("TRITON_INTERPRET") == "1":
        environ.update(INTERPRETER_ENV)
        path.insert(0, str(INTERPRETER_PATH))
    environ.update(PYTHONPATH=os.pathsep.join(path), **env)
    return environ


def engine_code(code: str, engine: build.Engine, timeout: float = 120, **env: str):
    """`python -c code` in a fresh interpreter with engine_environ(engine, **env); the finished
    process (stdout and stderr as text), whatever its exit status."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code], env=engine_environ(engine, **env), capture_output=True,
                          text=True, timeout=timeout)


class EngineJob:
    """tests/`script` started in a fresh interpreter with engine_environ(engine, **env); it runs
    while the caller goes on (a job keeps one core busy: two side by side take the time of one)."""

    def __init__(self, script: str, engine: build.Engine, *args: str, timeout: float = 600, **env: str):
        import subprocess
        import sys
        import tempfile
        import time

        self.deadline = time.monotonic() + timeout
        # files, not pipes: a job's output must not fill a pipe while another job is waited on
        self.out, self.err = (tempfile.TemporaryFile("w+", errors="replace") for _ in range(2))
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name(script)), *args],
                                     env=engine_environ(engine, **env), stdout=self.out, stderr=self.err)
        self.result: dict | None = None

    def report(self) -> dict:
        """Waits for the job (until its timeout, then stops it); the JSON object its last line prints."""
        import json
        import subprocess
        import time

        if self.result is None:
            try:
                self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stop()
                raise
            self.out.seek(0)
            self.err.seek(0)
            assert self.proc.returncode == 0, self.err.read()[-3000:]
            self.result = json.loads(self.out.read().strip().splitlines()[-1])
        return self.result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()
        self.err.close()


def engine_job(script: str, engine: build.Engine, *args: str, timeout: float = 600, **env: str) -> dict:
    """Run tests/`script` in a fresh interpreter with engine_environ(engine, **env); returns the
    JSON object its last line prints."""
    job = EngineJob(script, engine, *args, timeout=timeout, **env)
    try:
        return job.report()
    finally:
        job.stop()


@contextlib.contextmanager
def engine_jobs(script: str, engine: build.Engine, *args: str, runs: dict[str, dict[str, str]], timeout: float = 600,
                **env: str):
    """An EngineJob of tests/`script` for each of `runs` (a name and the environment it adds to
    `env`), all started at once; yields them by name, and stops those still running at the end."""
    jobs: dict[str, EngineJob] = {}
    try:
        for name, extra in runs.items():
            jobs[name] = EngineJob(script, engine, *args, timeout=timeout, **{**env, **extra})
        yield jobs
    finally:
        for job in jobs.values():
            job.stop()


def engine_module(engine: build.Engine, name: str):
    """A module of the engine's `transformers/_pb/`, loaded as a package of its own (for the
    modules that need nothing else of transformers: parsers, schema checks, grammar masks)."""
    import importlib
    import importlib.util
    import sys

    package = f"pb_engine_{engine.build_id.replace('-', '_').replace('.', '_')}"
    if package not in sys.modules:
        pb_dir = engine.site / "transformers" / "_pb"
        spec = importlib.util.spec_from_file_location(package, pb_dir / "__init__.py",
                                                      submodule_search_locations=[str(pb_dir)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[package] = module
        spec.loader.exec_module(module)
    return importlib.import_module(f"{package}.{name}")


# The sampler's and the grammar's modules, and the tiny model's tokenizer, for the tests that
# drive them directly (a module that means something else by one of these names defines its own).
@pytest.fixture(scope="session")
def grammar(patched_engine):
    return engine_module(patched_engine, "api.grammar")


@pytest.fixture(scope="session")
def sampler(patched_engine):
    return engine_module(patched_engine, "runtime.sampler")


@pytest.fixture(scope="session")
def bs(patched_engine):
    """0630's batched sampler."""
    return engine_module(patched_engine, "runtime.batched_sampler")


@pytest.fixture(scope="session")
def tok(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


class Server:
    def __init__(self, engine: build.Engine, model: str, knobs: dict[str, str], run_dir: Path, **settings):
        self.cfg = dataclasses.replace(LOCAL, port=free_port(), knobs=knobs, run_dir=str(run_dir), **settings)
        self.files = launch.RunFiles(run_dir)
        self.model = model
        self.engine = engine
        self.info = launch.start(self.cfg, engine, model, self.files, progress=lambda *_: None)

    @property
    def url(self) -> str:
        return self.cfg.url

    def stop(self) -> None:
        launch.stop(self.files)


# The embedded default config and its knob set: what `scripts/serve.sh start` serves.
LOCAL = config.load(config.CONFIG_DIR / "local.env.example", environ={})
ALL_ON = LOCAL.knobs


@pytest.fixture(scope="session")
def server_on(patched_engine, tiny_model, tmp_path_factory):
    """The patched engine with every adopted knob on (the local default config's set)."""
    server = Server(patched_engine, tiny_model, ALL_ON, tmp_path_factory.mktemp("run-on"))
    yield server
    server.stop()


def sampled_reply(server, i: int, seed: int | None, **extra) -> str:
    """The content of a 24-token sampled chat reply (temperature 0.8, top_p 0.95 unless `extra`
    says otherwise) to request `i`, seeded or not."""
    import httpx

    body = {"messages": [{"role": "user", "content": f"Request {i}: describe a list comprehension."}],
            "max_tokens": 24, "temperature": 0.8, "top_p": 0.95, "ignore_eos": True, **extra}
    if seed is not None:
        body["seed"] = seed
    r = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.fixture(scope="session")
def batched_server(patched_engine, tiny_model, tmp_path_factory):
    """Every adopted knob on (the batched sampler among them), with a pool small enough that 32
    requests at once share steps."""
    server = Server(patched_engine, tiny_model, {**ALL_ON, "PB_BATCHED_SAMPLER": "1"},
                    tmp_path_factory.mktemp("run-batched"), engine_args="--cb-num-blocks 64 --cb-max-batch-tokens 1024")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def server_off(patched_engine, tiny_model, tmp_path_factory):
    """The patched engine with every knob unset: must serve exactly what upstream serves."""
    server = Server(patched_engine, tiny_model, {}, tmp_path_factory.mktemp("run-off"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def server_pristine(pristine_engine, tiny_model, tmp_path_factory):
    """Upstream's engine, built from upstream/ with no patches."""
    server = Server(pristine_engine, tiny_model, {}, tmp_path_factory.mktemp("run-pristine"))
    yield server
    server.stop()

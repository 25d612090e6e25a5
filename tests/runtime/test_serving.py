"""One runtime interface: the config's RUNTIME picks it once, and each verb is its method."""

import dataclasses

import pytest

from patchbay.runtime.config import Config
from patchbay.runtime.docker.verbs import Docker
from patchbay.runtime.local import Local
from patchbay.runtime.serving import Runtime, runtime_for
from patchbay.verb import Fail


def test_the_config_chooses_the_runtime_once(tmp_path):
    local = Config(run_dir=str(tmp_path))
    docker = dataclasses.replace(local, runtime="docker")
    assert type(runtime_for(local)) is Local and type(runtime_for(docker)) is Docker
    assert type(runtime_for(local, "docker")) is Docker  # `build --image` on a local config
    for runtime in (runtime_for(local), runtime_for(docker)):
        assert all(callable(getattr(runtime, verb)) for verb in ("build", "start", "stop", "status", "logs"))
        assert runtime.cfg in (local, docker)
    assert set(Runtime.__dict__) >= {"build", "start", "stop", "status", "logs"}


def test_local_verbs_with_nothing_running(tmp_path, capsys):
    local = runtime_for(Config(run_dir=str(tmp_path / "run")))
    assert local.status() == 3 and local.stop() == 0
    assert capsys.readouterr().out == "not running\nnot running\n"
    with pytest.raises(Fail, match="no log yet; start the server first"):
        local.logs(0, 10, False)
    with pytest.raises(Fail, match="no log of rank 1"):
        local.logs(1, 10, False)


def test_docker_only_verbs_refuse_the_local_runtime(tmp_path):
    with pytest.raises(Fail, match="RUNTIME=local; this verb is for RUNTIME=docker") as e:
        Docker(Config(run_dir=str(tmp_path))).watch(0.0, once=True)
    assert e.value.code == 2

"""config.load: the .env file, PATCHBAY_* overrides, one-line errors, the shipped examples."""

from dataclasses import replace
from pathlib import Path

import pytest

from patchbay import ROOT
from patchbay.runtime import config
from patchbay.series import knobs, series
from patchbay.runtime.config import ConfigError

GOOD = """\
# a comment, then a blank line

MODEL=synthetic:tiny
HOST=0.0.0.0
ALLOW_UNAUTHENTICATED=1
PORT=8123
CONTINUOUS_BATCHING=0
SYNTH_SEED=7
SYNTH_CONTEXT=4096
READY_TIMEOUT=30
ENGINE_ARGS="--cb-num-blocks 64"
PB_ALPHA=1
PB_BETA = 'x,y'
"""


def write(tmp_path, text, name="test.env"):
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line_error(path, environ=None):
    with pytest.raises(ConfigError) as e:
        config.load(path, environ=environ or {})
    message = str(e.value)
    assert "\n" not in message
    return message


def test_good_file_gives_typed_values(tmp_path):
    path = write(tmp_path, GOOD)
    cfg = config.load(path, environ={"PORT": "1", "HOST": "10.0.0.1"})  # bare names are not overrides
    assert cfg.model == "synthetic:tiny"
    assert cfg.host == "0.0.0.0"
    assert cfg.port == 8123 and isinstance(cfg.port, int)
    assert cfg.continuous_batching is False
    assert (cfg.synth_seed, cfg.synth_context, cfg.ready_timeout) == (7, 4096, 30)
    assert cfg.engine_args == "--cb-num-blocks 64"
    assert cfg.knobs == {"PB_ALPHA": "1", "PB_BETA": "x,y"}
    assert cfg.source == str(path)
    assert cfg.url == "http://0.0.0.0:8123"
    assert (cfg.runtime, cfg.device) == ("local", "cpu")  # defaults for keys the file leaves out


def test_environment_overrides_the_file(tmp_path):
    path = write(tmp_path, GOOD)
    cfg = config.load(path, environ={"PATCHBAY_PORT": "9001", "PATCHBAY_CONTINUOUS_BATCHING": "1",
                                     "PATCHBAY_PB_ALPHA": "0"})
    assert cfg.port == 9001
    assert cfg.continuous_batching is True
    assert cfg.knobs["PB_ALPHA"] == "1"  # knobs come from the file only


def test_bad_environment_override_names_the_variable(tmp_path):
    message = one_line_error(write(tmp_path, GOOD), environ={"PATCHBAY_PORT": "eighty"})
    assert message == "environment PATCHBAY_PORT: PORT=eighty is not an integer"


def test_out_of_range_environment_override_is_not_blamed_on_the_file(tmp_path):
    message = one_line_error(write(tmp_path, GOOD), environ={"PATCHBAY_PORT": "70000"})
    assert "PORT=70000" in message and "PATCHBAY_PORT" in message


def test_malformed_line_names_file_and_line(tmp_path):
    path = write(tmp_path, "PORT=8000\n# ok\nthis is not a setting\n")
    message = one_line_error(path)
    assert message.startswith(f"{path}:3: expected KEY=VALUE")


def test_duplicated_key_names_file_and_line(tmp_path):
    path = write(tmp_path, "PORT=8000\nHOST=127.0.0.1\nPORT=8001\n")
    assert one_line_error(path) == f"{path}:3: PORT is set twice"


def test_unknown_key_names_the_allowed_keys(tmp_path):
    path = write(tmp_path, "PORT=8000\nCOLOUR=blue\n")
    message = one_line_error(path)
    assert message.startswith(f"{path}: unknown setting COLOUR (allowed: ")
    for key in ("MODEL", "HOST", "PORT", "CONTINUOUS_BATCHING", "ENGINE_ARGS", "KNOBS", "PB_* knobs"):
        assert key in message
    assert "KNOB_SET" not in message and "SOURCE" not in message


@pytest.mark.parametrize("line, expected", [
    ("PORT=abc", "PORT=abc is not an integer"),
    ("PORT=70000", "PORT=70000 is out of range (allowed: 1-65535)"),
    ("PORT=0", "PORT=0 is out of range"),
    ("CONTINUOUS_BATCHING=yes", "CONTINUOUS_BATCHING=yes is not a valid value (allowed: 0, 1)"),
    ("HOST=not-an-ip", "HOST=not-an-ip is not an IP address"),
    ("MODEL=relative/path", "MODEL=relative/path must be synthetic:tiny, synthetic:trained, synthetic:trained-fp8 or a local checkpoint folder"),
    ("RUNTIME=ssh", "RUNTIME=ssh is not supported (allowed: local, docker)"),
    ("WORKER=gpu2", "WORKER=gpu2 is not a node (allowed: local, ssh://user@host, or empty for one node)"),
    ("HEAD=", "HEAD= is not a node (allowed: local, ssh://user@host)"),
    ("HEAD_ADDR=10.0.0.1 x", "HEAD_ADDR=10.0.0.1 x is not an IP address or host name"),
    ("GLOO_IFNAME=eth0;rm", "GLOO_IFNAME=eth0;rm is not a network interface name"),
    ("RUNTIME=docker\nWORKER=local", "RUNTIME=docker runs one rank per node: TP=2 with a WORKER, or TP=1 "
     "without one (got TP=1, WORKER=local)"),
    ("RUNTIME=docker\nTP=2\nPB_TENSOR_PARALLEL=1", "RUNTIME=docker runs one rank per node"),
    ("MIN_DISK_GIB=-1", "MIN_DISK_GIB=-1 must be 0 or more"),
    ("PAIR=My Pair", "PAIR=My Pair must be a container name prefix"),
    ("READY_TIMEOUT=0", "READY_TIMEOUT=0 must be at least 1"),
    ("SYNTH_SEED=", "SYNTH_SEED= is not an integer"),
    ("SYNTH_CONTEXT=64", "SYNTH_CONTEXT=64 is out of range (allowed: 128-1048576 tokens)"),
    ("SYNTH_CONTEXT=2097152", "SYNTH_CONTEXT=2097152 is out of range"),
    ("TP=0", "TP=0 is out of range (allowed: 1-8)"),
    ("TP=2", "TP=2 needs PB_TENSOR_PARALLEL=1"),
    ("PB_TENSOR_PARALLEL=1", "PB_TENSOR_PARALLEL=1 needs TP=2 or more"),
    ("TP=2\nPB_TENSOR_PARALLEL=1\nCONTINUOUS_BATCHING=0", "TP=2 needs CONTINUOUS_BATCHING=1"),
    ("RDZV_PORT=8000\nPORT=8000", "RDZV_PORT=8000 must be a port (1-65535) other than PORT"),
])
def test_bad_value_is_one_line_naming_the_key(tmp_path, line, expected):
    path = write(tmp_path, f"DEVICE=cpu\n{line}\n")
    message = one_line_error(path)
    assert message.startswith(f"{path}: ") and expected in message


def test_missing_file_is_an_error(tmp_path):
    message = one_line_error(tmp_path / "nope.env")
    assert str(tmp_path / "nope.env") in message and "no such config file" in message


def test_relative_path_is_reported_relative_to_the_repo(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = config.load(Path("config/minimal.env.example"), environ={})
    assert cfg.source == "config/minimal.env.example"


@pytest.mark.parametrize("name", ["local.env.example", "minimal.env.example", "prod.env.example"])
def test_shipped_examples_load_and_set_only_real_knobs(name):
    cfg = config.load(ROOT / "config" / name, environ={})
    assert cfg.source == f"config/{name}"
    loaded, problems = series.load()
    assert problems == []
    assert knobs.validate_settings(loaded.knobs(), cfg.knobs, cfg.source) == []
    if name == "minimal.env.example":
        assert cfg.knobs == {}, "the all-off baseline must set no PB_* knob"
    else:
        adopted = {p.knob.name for p in loaded.patches if p.knob and p.status == "adopted"}
        assert adopted <= set(cfg.knobs), "the embedded default turns every adopted knob on"


def test_inline_comments_and_strict_integers(tmp_path):
    path = tmp_path / "c.env"
    path.write_text("PORT=8123   # a spare port\nPB_SSE_DONE=1 # on\nENGINE_ARGS='--x #not-a-comment'\n")
    cfg = config.load(path, environ={})
    assert cfg.port == 8123 and cfg.knobs == {"PB_SSE_DONE": "1"} and cfg.engine_args == "--x #not-a-comment"
    path.write_text("PORT=8_000\n")
    with pytest.raises(config.ConfigError, match="PORT=8_000 is not an integer"):
        config.load(path, environ={})


def test_tp_settings_and_the_rank_environment(tmp_path):
    from patchbay.runtime.launch import rank_env
    from patchbay.runtime.procenv import NO_MULTICAST

    path = write(tmp_path, "PORT=8123\nTP=2\nRDZV_PORT=29611\nPB_TENSOR_PARALLEL=1\n")
    cfg = config.load(path, environ={})
    assert (cfg.tp, cfg.rdzv_port) == (2, 29611)
    assert config.load(write(tmp_path, "PORT=8123\n", "one.env"), environ={}).tp == 1  # the default
    env = rank_env(cfg, 1)
    assert env["RANK"] == "1" and env["WORLD_SIZE"] == "2" and env["LOCAL_RANK"] == "1"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29611")
    assert NO_MULTICAST == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                            "NVSHMEM_DISABLE_NVLS": "1"}
    assert NO_MULTICAST.items() <= env.items(), "NVLink multicast stays off on every rank"
    assert rank_env(replace(cfg, tp=1, knobs={}), 0) == {}


# ---- named knob sets (config/knob-sets.toml) -----------------------------------------------


def test_every_adopted_patch_is_in_prod_and_every_set_is_valid():
    loaded, problems = series.load()
    assert problems == []
    sets = config.knob_sets()
    assert set(sets) == {"minimal", "local", "prod"}
    assert sets["minimal"] == {}
    for name, knobs_of_set in sets.items():
        assert knobs.validate_settings(loaded.knobs(), knobs_of_set, name) == []
    adopted = {p.knob.name for p in loaded.patches if p.knob and p.status == "adopted"}
    prod = sets["prod"]
    assert adopted <= set(prod)
    rejected = {p.knob.name for p in loaded.patches if p.knob and p.status == "rejected"}
    assert not rejected & set(prod)
    # local is prod in one CPU process: the same knobs but tensor parallelism and graph sampling
    assert set(prod) - set(sets["local"]) == {"PB_TENSOR_PARALLEL", "PB_GRAPH_SAMPLING"}


@pytest.mark.parametrize("name", ["local", "minimal", "prod"])
def test_each_example_config_names_its_set(name):
    cfg = config.load(ROOT / "config" / f"{name}.env.example", environ={})
    assert cfg.knob_set == name and cfg.knobs == config.knob_set(name)
    assert "PB_" not in "".join(line.split("#")[0] for line in
                                (ROOT / "config" / f"{name}.env.example").read_text().splitlines())


def test_a_pb_line_changes_one_knob_of_the_set_and_a_bad_set_is_named(tmp_path):
    cfg = config.load(write(tmp_path, "KNOBS=local\nPB_MODELS_INFO=0\nPB_MOE_TMA=1\n"), environ={})
    assert cfg.knobs == {**config.knob_set("local"), "PB_MODELS_INFO": "0", "PB_MOE_TMA": "1"}
    with pytest.raises(config.ConfigError, match=r"KNOBS=fast is not a knob set \(allowed: minimal, prod, local"):
        config.load(write(tmp_path, "KNOBS=fast\n", "bad.env"), environ={})
    # like the knobs, the set comes from the file only
    assert config.load(write(tmp_path, "KNOBS=minimal\n", "m.env"), environ={"PATCHBAY_KNOBS": "prod"}).knobs == {}


@pytest.mark.parametrize("text, error", [
    ('[a]\nbase = "b"\n[b]\nbase = "a"\n', r"\[a\] is its own base"),
    ('[a]\nbase = "z"\n', r"\[a\] base = 'z' is not a set"),
    ('[a]\nPB_X = "1"\n[b]\nbase = "a"\nunset = ["PB_Y"]\n', r"\[b\] unsets PB_Y, which its base does not set"),
    ('[a]\nPB_X = 1\n', r"\[a\] PB_X = 1: a set holds PB_\* knobs with string values"),
    ('[a]\nMODEL = "x"\n', r"\[a\] MODEL = 'x'"),
    ('[a\n', "not valid TOML"),
])
def test_a_broken_set_file_is_one_line_naming_the_set(tmp_path, text, error):
    path = tmp_path / "knob-sets.toml"
    path.write_text(text)
    with pytest.raises(config.ConfigError, match=error):
        config.knob_sets(path)


def test_a_base_and_unset_resolve(tmp_path):
    path = tmp_path / "knob-sets.toml"
    path.write_text('[a]\nPB_X = "1"\nPB_Y = "2"\n[b]\nbase = "a"\nunset = ["PB_X"]\nPB_Z = "3"\n')
    assert config.knob_sets(path) == {"a": {"PB_X": "1", "PB_Y": "2"}, "b": {"PB_Y": "2", "PB_Z": "3"}}


def test_a_reachable_host_needs_a_key_or_an_explicit_yes(tmp_path):
    message = one_line_error(write(tmp_path, "HOST=0.0.0.0\n"))
    assert "HOST=0.0.0.0 is reachable from other machines" in message and "API_KEY_FILE" in message
    assert config.load(write(tmp_path, "HOST=127.0.0.1\n"), environ={}).loopback
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    cfg = config.load(write(tmp_path, f"HOST=0.0.0.0\nPB_AUTH=1\nAPI_KEY_FILE={key}\n"), environ={})
    assert cfg.auth_headers() == {"Authorization": "Bearer s3cret"}
    assert cfg.engine_http_env() == {"API_KEY_FILE": str(key)}


def test_a_key_file_needs_the_auth_knob_and_an_absolute_path(tmp_path):
    assert "API_KEY_FILE needs PB_AUTH=1" in one_line_error(write(tmp_path, "API_KEY_FILE=/etc/key\n"))
    assert "must be an absolute path" in one_line_error(write(tmp_path, "PB_AUTH=1\nADMIN_KEY_FILE=key\n"))


def test_served_model_names_are_checked_and_reach_the_http_rank(tmp_path):
    assert "SERVED_MODEL_NAME needs PB_SERVED_NAMES=1" in one_line_error(write(tmp_path, "SERVED_MODEL_NAME=glm\n"))
    message = one_line_error(write(tmp_path, "PB_SERVED_NAMES=1\nSERVED_MODEL_NAME=glm,has space\n"))
    assert "'has space' is not a model name" in message
    cfg = config.load(write(tmp_path, "PB_SERVED_NAMES=1\nSERVED_MODEL_NAME=glm-4.5,org/glm\n"), environ={})
    assert cfg.engine_http_env() == {"SERVED_MODEL_NAME": "glm-4.5,org/glm"}
    assert cfg.served_names("/srv/models/GLM-4.5-Air") == "glm-4.5,org/glm"
    unnamed = config.load(write(tmp_path, "PB_SERVED_NAMES=1\n"), environ={})
    assert unnamed.served_names("/srv/models/GLM-4.5-Air/") == "GLM-4.5-Air"  # the folder's name
    assert config.load(write(tmp_path, "\n"), environ={}).served_names("/srv/m") == "/srv/m"  # knob off: the path


def test_the_host_tier_adds_to_the_memory_a_node_must_have(tmp_path):
    """0790 pins PB_HOST_TIER_MB of host memory per rank at start: preflight asks each node for
    MIN_MEM_GIB plus that (rounded up to whole GiB)."""
    base = config.load(write(tmp_path, "KNOBS=minimal\nMIN_MEM_GIB=16\n"), environ={})
    assert base.mem_gib_needed == 16
    tier = config.load(write(tmp_path, "KNOBS=minimal\nMIN_MEM_GIB=16\nPB_HOST_TIER_MB=2500\n", "tier.env"), environ={})
    assert tier.mem_gib_needed == 16 + 3
    prod = config.load(ROOT / "config" / "prod.env.example", environ={})
    assert prod.mem_gib_needed == prod.min_mem_gib + int(config.knob_set("prod")["PB_HOST_TIER_MB"]) // 1024

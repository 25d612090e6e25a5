"""opencode, a real coding agent, against a live server: a whole agent turn, and compaction.

opencode (pinned below, installed from npm into .cache/) runs offline (`opencode run`)
with the provider config the README shows, against a server of the embedded default
(config/local.env.example: its model, context and KV cache) with forced decoding added: the
tiny model's weights are random, so its replies are queued (0110). Everything else is real:
opencode sends its ~31 KB requests (system prompt, 10 tools, JSON Schema 2020-12), the
engine runs every step, 0080 parses the forced GLM tool call, opencode executes its `write`
tool and sends the result back. The second reply is queued to match only a request whose
last message is that tool result, so the final text proves the result came back.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from patchbay import ROOT
from patchbay.runtime.models import model_path

from .conftest import ALL_ON, LOCAL, Server

pytestmark = pytest.mark.engine

OPENCODE_VERSION = "1.18.33"
OFFLINE = {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"}


@pytest.fixture(scope="module")
def opencode() -> Path:
    prefix = ROOT / ".cache" / "opencode" / OPENCODE_VERSION
    binary = prefix / "node_modules" / ".bin" / "opencode"
    if not binary.exists():
        npm = shutil.which("npm")
        assert npm, "npm is needed to install opencode (.ci/run installs Debian's nodejs and npm)"
        subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                        f"opencode-ai@{OPENCODE_VERSION}"], check=True, capture_output=True, timeout=600)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == OPENCODE_VERSION, version
    return binary


@pytest.fixture(scope="module")
def server(patched_engine, tmp_path_factory):
    """The embedded default's server (Server starts from its config), plus forced decoding."""
    s = Server(patched_engine, model_path(LOCAL), {**ALL_ON, "PB_FORCED_DECODING": "1"},
               tmp_path_factory.mktemp("run-oc"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def served(server) -> dict:
    """What the server lists at GET /v1/models: the model id a client names, and its context."""
    listed = httpx.get(f"{server.url}/v1/models").json()["data"]
    assert len(listed) == 1, listed
    assert listed[0]["context_length"] == LOCAL.synth_context  # 0040 reports the context the config asked for
    return listed[0]


def readme_config() -> dict:
    """The opencode.json README shows: the first json block after its opencode heading."""
    after = (ROOT / "README.md").read_text().split("**opencode.**", 1)[1]
    return json.loads(after.split("```json\n", 1)[1].split("```", 1)[0])


def provider_config(server, served) -> dict:
    """README's opencode config, as a user fills it in for this server, plus test settings."""
    documented = readme_config()
    provider = documented["provider"]["patchbay"]
    model = provider["models"]["glm"]
    # What README says of the embedded default is what it serves: its address and its context.
    assert provider["options"]["baseURL"] == f"{LOCAL.url}/v1"
    assert model["limit"]["context"] == served["context_length"]
    provider["options"]["baseURL"] = f"{server.url}/v1"
    model["id"] = served["id"]
    model["limit"]["output"] = 256  # the replies that are not queued (compaction's) stay short
    return {**documented, "small_model": "patchbay/glm", "permission": {"edit": "allow", "bash": "allow"},
            "autoupdate": False, "share": "disabled"}


def run_opencode(binary: Path, project: Path, home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI", "ANTHROPIC", "OPENCODE"))}
    env.update(OFFLINE, PWD=str(project), HOME=str(home),  # opencode takes its project from PWD XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"),
               XDG_STATE_HOME=str(home / "state"),
               # opencode installs the provider package from npm on first use; keep it between runs
               XDG_CACHE_HOME=str(ROOT / ".cache" / "opencode" / "xdg-cache"))
    return subprocess.run([str(binary), "run", *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=420)


def queue(server, *replies) -> None:
    httpx.delete(f"{server.url}/pb/forced")
    r = httpx.post(f"{server.url}/pb/forced", json={"replies": list(replies)})
    assert r.status_code == 200, r.text


def chat_statuses(server) -> list[int]:
    log = (Path(server.cfg.run_dir) / "server.log").read_text()
    return [int(line.split('" ')[1].split()[0]) for line in log.splitlines()
            if '"POST /v1/chat/completions HTTP/1.1"' in line]


@pytest.fixture()
def project(tmp_path, server, served):
    root = tmp_path / "project"
    root.mkdir()
    (root / "opencode.json").write_text(json.dumps(provider_config(server, served), indent=2))
    return root


def test_an_agent_turn_writes_a_file(opencode, server, project, tmp_path):
    target = project / "hello.txt"
    queue(server,
          {"text": "\n<think>The user wants a file.</think>\nWriting it.\n<tool_call>write\n"
                   f"<arg_key>filePath</arg_key>\n<arg_value>{target}</arg_value>\n"
                   "<arg_key>content</arg_key>\n<arg_value>hello from patchbay\n</arg_value>\n</tool_call>",
           "when": {"tools": True, "last_user_contains": "Create hello.txt"}},
          {"text": "Done: hello.txt now says hello.",
           "when": {"tools": True, "tool_result_contains": "Wrote file successfully"}})
    done = run_opencode(opencode, project, tmp_path / "home", "Create hello.txt with a greeting")
    assert done.returncode == 0, done.stdout + done.stderr
    assert target.read_text() == "hello from patchbay\n"
    assert "Done: hello.txt now says hello." in done.stdout
    assert httpx.get(f"{server.url}/pb/forced").json()["pending"] == 0  # both replies were taken
    assert set(chat_statuses(server)) == {200}


def test_a_prompt_over_the_context_makes_opencode_compact(opencode, server, served, project, tmp_path):
    home = tmp_path / "home"
    queue(server, {"text": "Hello.", "when": {"tools": True}})
    first = run_opencode(opencode, project, home, "Say hello")
    assert first.returncode == 0 and "Hello." in first.stdout, first.stdout + first.stderr
    before = len(chat_statuses(server))
    queue(server, {"text": "Noted after compaction.", "when": {"tools": True, "last_user_contains": "Continue"}})
    # About 58K tokens: over the context with opencode's ~10K of system prompt and tools, yet
    # room for its compaction request. In pieces: Linux caps one argument at 128 KiB, and
    # opencode joins its message's arguments with spaces.
    big = ["Here is some background about patches and serving. " * 1200] * 3
    second = run_opencode(opencode, project, home, "--continue", *big)
    output = second.stdout + second.stderr
    statuses = chat_statuses(server)[before:]
    # The 400 (context_length_exceeded, "maximum context length is N tokens") is one opencode
    # recognises: it reports it, compacts the conversation and carries on. (Its exit status
    # is 1 because it reported an error along the way.)
    assert 400 in statuses and f"maximum context length is {served['context_length']} tokens" in second.stderr, output
    assert "compacted" in second.stdout, output
    assert statuses[-1] == 200 and "Noted after compaction." in second.stdout, output

"""opencode, a real coding agent, against a live server: a whole agent turn, and compaction.

opencode (pinned below, installed from npm into .cache/) runs offline (`opencode run`)
with the provider config the README shows. The tiny model's weights are random, so its
replies are queued with forced decoding (0110); everything else is real: opencode sends its
~31 KB requests (system prompt, 10 tools, JSON Schema 2020-12), the engine runs every step,
0080 parses the forced GLM tool call, opencode executes its `write` tool and sends the
result back. The second reply is queued to match only a request whose last message is that
tool result, so the final text proves the result came back.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from patchbay import ROOT

from .conftest import ALL_ON, Server

pytestmark = pytest.mark.engine

OPENCODE_VERSION = "1.18.33"
CONTEXT = 16384  # opencode's first request is ~10.4K tokens of the tiny tokenizer
OFFLINE = {"OPENCODE_DISABLE_MODELS_FETCH": "1", "OPENCODE_DISABLE_AUTOUPDATE": "1",
           "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1"}


@pytest.fixture(scope="module")
def opencode() -> Path:
    prefix = ROOT / ".cache" / "opencode" / OPENCODE_VERSION
    binary = prefix / "node_modules" / ".bin" / "opencode"
    if not binary.exists():
        npm = shutil.which("npm")
        assert npm, "npm is needed to install opencode (CI installs Node.js)"
        subprocess.run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund",
                        f"opencode-ai@{OPENCODE_VERSION}"], check=True, capture_output=True, timeout=600)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == OPENCODE_VERSION, version
    return binary


@pytest.fixture(scope="module")
def server(patched_engine, tmp_path_factory):
    from patchbay.runtime import synth

    model = synth.write_tiny(ROOT / ".cache" / "models" / f"tiny-s0-c{CONTEXT // 1024}k", seed=0, context=CONTEXT)
    s = Server(patched_engine, str(model), {**ALL_ON, "PB_FORCED_DECODING": "1"}, tmp_path_factory.mktemp("run-oc"),
               engine_args="--cb-num-blocks 160 --cb-max-batch-tokens 2048")
    yield s
    s.stop()


def provider_config(server) -> dict:
    """The opencode config the README documents, pointed at this server."""
    return {
        "$schema": "https://opencode.ai/config.json",
        "provider": {"patchbay": {
            "npm": "@ai-sdk/openai-compatible",
            "name": "patchbay",
            "options": {"baseURL": f"{server.url}/v1", "apiKey": "unused"},
            "models": {"glm": {"id": server.model, "name": "GLM (patchbay)",
                               "limit": {"context": CONTEXT, "output": 256}}},
        }},
        "model": "patchbay/glm",
        "small_model": "patchbay/glm",
        "permission": {"edit": "allow", "bash": "allow"},
        "autoupdate": False,
        "share": "disabled",
    }


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
def project(tmp_path, server):
    root = tmp_path / "project"
    root.mkdir()
    (root / "opencode.json").write_text(json.dumps(provider_config(server), indent=2))
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


def test_a_prompt_over_the_context_makes_opencode_compact(opencode, server, project, tmp_path):
    home = tmp_path / "home"
    queue(server, {"text": "Hello.", "when": {"tools": True}})
    first = run_opencode(opencode, project, home, "Say hello")
    assert first.returncode == 0 and "Hello." in first.stdout, first.stdout + first.stderr
    before = len(chat_statuses(server))
    queue(server, {"text": "Noted after compaction.", "when": {"tools": True, "last_user_contains": "Continue"}})
    big = "Here is some background about patches and serving. " * 800  # ~ 8K tokens: over 16K with the rest
    second = run_opencode(opencode, project, home, "--continue", big)
    output = second.stdout + second.stderr
    statuses = chat_statuses(server)[before:]
    # The 400 (context_length_exceeded, "maximum context length is N tokens") is one opencode
    # recognises: it reports it, compacts the conversation and carries on. (Its exit status
    # is 1 because it reported an error along the way.)
    assert 400 in statuses and f"maximum context length is {CONTEXT} tokens" in second.stderr, output
    assert "compacted" in second.stdout, output
    assert statuses[-1] == 200 and "Noted after compaction." in second.stdout, output

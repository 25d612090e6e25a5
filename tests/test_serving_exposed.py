"""Serving exposed (0500-0550): what a client sends never stops the engine or reaches past the API.

Against the real engine on the tiny model: client mistakes answered 4xx in the OpenAI error
shape, typed schemas in /openapi.json, a faulting batching step failing only its own requests,
a dead worker exiting the server, oversized bodies refused, templates off the event loop,
the bearer key and the admin routes.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from .conftest import ALL_ON, Server, engine_code
from .test_metrics import log_lines

USER = [{"role": "user", "content": "Say something about the sea."}]
CHAT, COMPLETIONS, RESPONSES = "/v1/chat/completions", "/v1/completions", "/v1/responses"


def chat(**extra) -> dict:
    return {"messages": USER, "max_tokens": 4, **extra}


# (path, body, status, param or None, code); a str body is sent as it is.
MISTAKES = [
    (CHAT, chat(temperature="hot"), 400, "temperature", "invalid_value"),
    (CHAT, chat(seed="abc"), 400, "seed", "invalid_value"),
    (CHAT, chat(seed=2**70), 400, "seed", "invalid_value"),
    (CHAT, chat(tools=5), 400, "tools", "invalid_value"),
    (CHAT, chat(logit_bias=[1, 2]), 400, "logit_bias", "invalid_value"),
    (CHAT, chat(stream="yes"), 400, "stream", "invalid_value"),
    (CHAT, chat(max_tokens=1.5), 400, "max_tokens", "invalid_value"),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", "invalid_value"),
    (CHAT, {"messages": [{"role": "user", "content": 7}]}, 400, "messages[0].content", "invalid_value"),
    (CHAT, {"messages": []}, 400, "messages", "invalid_value"),
    (CHAT, {"model": "m"}, 400, "messages", "missing_field"),
    # vLLM's clients' unknown fields are ignored (0600); with that knob off, upstream refuses them
    (CHAT, chat(surprise=1, pb_knobs={"PB_VLLM_FIELDS": 0}), 400, None, "unknown_field"),
    (CHAT, "{not json", 400, None, "invalid_json"),
    (CHAT, "[1, 2]", 400, None, "invalid_body"),
    (COMPLETIONS, {}, 400, "prompt", "empty_prompt"),
    (COMPLETIONS, {"prompt": ""}, 400, "prompt", "empty_prompt"),
    (COMPLETIONS, {"prompt": 5}, 400, "prompt", "invalid_value"),
    (COMPLETIONS, {"prompt": "hi", "temperature": [1]}, 400, "temperature", "invalid_value"),
    (RESPONSES, {}, 400, "input", "missing_field"),
    (RESPONSES, {"input": ""}, 400, "input", "invalid_value"),
    (RESPONSES, {"input": "hi", "max_output_tokens": -3}, 400, "max_output_tokens", "invalid_value"),
    ("/v1/nothing-here", {}, 404, None, "not_found"),
]


@pytest.mark.parametrize("path,body,status,param,code", MISTAKES,
                         ids=[f"{m[0]}-{m[4]}-{m[3]}" for m in MISTAKES])
def test_client_mistakes_are_4xx_in_the_openai_shape(server_on, path, body, status, param, code):
    content = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(f"{server_on.url}{path}", content=content, headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert (error["param"], error["code"]) == (param, code), error
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert "Traceback" not in r.text and "/work" not in error["message"]
    if param:
        assert param.split("[")[0] in error["message"]


def test_after_every_mistake_the_engine_still_serves(server_on):
    for path, body, *_ in MISTAKES:
        httpx.post(f"{server_on.url}{path}", content=body if isinstance(body, str) else json.dumps(body),
                   headers={"content-type": "application/json"}, timeout=60)
    health = httpx.get(f"{server_on.url}/health", timeout=10)
    assert health.status_code == 200, health.text
    r = httpx.post(f"{server_on.url}{COMPLETIONS}", json={"prompt": "The sea", "max_tokens": 3}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3, r.text


def test_a_wrong_method_is_a_405_in_the_openai_shape(server_on):
    r = httpx.delete(f"{server_on.url}/v1/models", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed", r.text


def test_openapi_documents_the_request_schemas(server_on):
    doc = httpx.get(f"{server_on.url}/openapi.json", timeout=10).json()
    schemas = doc["components"]["schemas"]
    chat_schema = schemas["ChatCompletionRequest"]
    assert "messages" in chat_schema["required"]
    assert {"temperature", "seed", "tools", "response_format"} <= set(chat_schema["properties"])
    assert "input" in schemas["ResponsesRequest"]["required"]
    body = doc["paths"][CHAT]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatCompletionRequest"}


def test_a_body_over_the_limit_is_a_413_before_it_is_read(server_on):
    limit = int(ALL_ON["PB_MAX_BODY_MB"]) * 1024 * 1024
    body = json.dumps({"messages": [{"role": "user", "content": "x" * (limit + 1024)}]})
    r = httpx.post(f"{server_on.url}{CHAT}", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text[:300]
    assert r.json()["error"]["code"] == "request_too_large" and "PB_MAX_BODY_MB" in r.json()["error"]["message"]
    assert httpx.get(f"{server_on.url}/health", timeout=10).status_code == 200


def _health_during_big_prompt(url: str) -> tuple[float, list[float]]:
    """(how long the big request took, how long each /health probe sent while it ran waited)."""
    # Many short messages: the template's own loop is the slow part (a long text alone is cut
    # short by 0420's split tokenizing once it passes the context). 300,000 of them make about
    # 11 MB, under the 16 MB body limit.
    body = json.dumps({"messages": [{"role": "user", "content": "sea"}] * 300_000, "max_tokens": 2})
    done: dict = {}

    def big():
        r = httpx.post(f"{url}{CHAT}", content=body, headers={"content-type": "application/json"}, timeout=300)
        done["status"], done["at"] = r.status_code, time.monotonic()

    waits = []
    thread = threading.Thread(target=big)
    began = time.monotonic()
    thread.start()
    while thread.is_alive():  # probes for as long as the big request runs, one every 50 ms
        sent = time.monotonic()
        r = httpx.get(f"{url}/health", timeout=300)
        assert r.status_code == 200
        waits.append(time.monotonic() - sent)
        time.sleep(0.05)
    thread.join()
    assert done["status"] == 400  # the prompt is longer than the context
    return done["at"] - began, waits


def test_the_template_runs_off_the_event_loop(server_on):
    big_s, waits = _health_during_big_prompt(server_on.url)
    # The big prompt's template and tokenizing take seconds. Were they on the event loop, one
    # probe would wait nearly all of that (with PB_PREP_THREAD=0 one probe waited 4.6 s of a
    # 4.7 s request on a 2-core CPU); off it, the longest wait is the body's parsing (1.6 of 4.9 s).
    assert big_s > 1.0, f"the big request finished too soon ({big_s:.2f} s) to tell"
    assert max(waits) < big_s / 2, (big_s, waits)


@pytest.fixture(scope="module")
def fault_server(patched_engine, tiny_model, tmp_path_factory):
    """Production's knobs but 0500's input check: an empty prompt reaches the batching loop and
    faults its step, the one fault a client can still cause upstream."""
    server = Server(patched_engine, tiny_model, {**ALL_ON, "PB_API_ERRORS": "0"}, tmp_path_factory.mktemp("run-fault"))
    yield server
    server.stop()


def test_a_faulting_step_fails_its_own_request_and_the_others_carry_on(fault_server):
    # An empty prompt alone in a step makes upstream's attention reshape zero elements: the
    # step raises. Upstream's worker dies there (every later request a 503); here that request
    # fails and the loop goes on.
    url = fault_server.url
    r = httpx.post(f"{url}{COMPLETIONS}", json={"prompt": ""}, timeout=60)
    assert r.status_code == 500, r.text  # a real fault now (0500, off here, would have refused it)
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    replies = [httpx.post(f"{url}{CHAT}", json={"messages": [{"role": "user", "content": f"Story {i}."}],
                                                "max_tokens": 20}, timeout=60) for i in range(3)]
    assert [(x.status_code, x.json()["usage"]["completion_tokens"]) for x in replies] == [(200, 20)] * 3
    log = fault_server.files.log.read_text()
    assert "batching loop: a step failed (RuntimeError: cannot reshape tensor of 0 elements" in log
    assert "failed its 1 request(s)" in log


def test_a_dead_worker_exits_the_server_for_its_supervisor(patched_engine):
    # The watcher against upstream's real generation state, its CB manager holding a worker
    # that recorded a fatal error (as upstream's loop does when it stops).
    code = """
import time, types
from transformers.cli.serving.utils import GenerationState
from transformers._pb.runtime import faults
state = GenerationState(continuous_batching=True)
manager = state.get_manager("m", use_cb=True)
manager._cb = types.SimpleNamespace(background_thread_status=types.SimpleNamespace(fatal_error=RuntimeError("boom")))
assert not state.is_cb_alive()
faults.watch(state)
time.sleep(10)
print("still alive")
"""
    proc = engine_code(code, patched_engine, timeout=60, PB_FAULT_ISOLATION="1")
    assert proc.returncode == 70, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    assert "the batching worker died (RuntimeError: boom); exiting with code 70" in proc.stderr
    off = engine_code(code.replace("time.sleep(10)", "time.sleep(2)"), patched_engine, timeout=60)
    assert off.returncode == 0 and "still alive" in off.stdout, off.stderr[-2000:]


@pytest.fixture(scope="module")
def keyed_server(patched_engine, tiny_model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("run-keyed")
    (folder / "api-key").write_text("client-key-1\n")
    (folder / "admin-key").write_text("admin-key-1\n")
    server = Server(patched_engine, tiny_model, ALL_ON, folder, api_key_file=str(folder / "api-key"),
                    admin_key_file=str(folder / "admin-key"))
    yield server
    server.stop()


def test_the_key_guards_every_route(keyed_server):
    url = keyed_server.url
    for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("GET", "/openapi.json"), ("POST", CHAT),
                         ("POST", COMPLETIONS), ("POST", RESPONSES), ("POST", "/load_model")):
        r = httpx.request(method, f"{url}{path}", json={}, timeout=30)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"
    wrong = httpx.get(f"{url}/health", headers={"Authorization": "Bearer client-key-2"}, timeout=10)
    assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "invalid API key"
    right = httpx.get(f"{url}/health", headers={"Authorization": "Bearer client-key-1"}, timeout=10)
    assert right.status_code == 200, right.text


def test_the_openai_client_with_and_without_the_key(keyed_server):
    good = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key="client-key-1", max_retries=0)
    reply = good.chat.completions.create(model=keyed_server.model, messages=USER, max_tokens=3)
    assert reply.usage.completion_tokens == 3
    bad = openai.OpenAI(base_url=f"{keyed_server.url}/v1", api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=keyed_server.model, messages=USER, max_tokens=3)
    assert e.value.body["code"] == "invalid_api_key"


def test_admin_routes_need_the_admin_key(keyed_server, server_on):
    url = keyed_server.url
    client = {"Authorization": "Bearer client-key-1"}
    r = httpx.post(f"{url}/reset", headers=client, timeout=30)
    assert r.status_code == 401 and "admin key" in r.json()["error"]["message"], r.text
    # Without an admin key configured the routes do not exist at all.
    assert httpx.post(f"{server_on.url}/reset", timeout=30).status_code == 404
    assert httpx.post(f"{server_on.url}/load_model", json={"model": "/etc"}, timeout=30).status_code == 404
    ok = httpx.post(f"{url}/reset", headers={"Authorization": "Bearer admin-key-1"}, timeout=60)
    assert ok.status_code == 200, ok.text


def test_an_unreadable_key_file_stops_the_server_at_start(patched_engine):
    proc = engine_code("from transformers._pb.api import auth; auth.guard()", patched_engine,
                       PB_AUTH="1", API_KEY_FILE="/nonexistent/key")
    assert proc.returncode == 2 and "API_KEY_FILE=/nonexistent/key cannot be read" in proc.stderr, proc.stderr


def _running(url: str) -> int:
    requests = httpx.get(f"{url}/health", timeout=10).json()["requests"]
    return requests["running"] + requests["waiting"]


def _until_idle(url: str, deadline_s: float = 60) -> float:
    t0 = time.monotonic()
    while _running(url) and time.monotonic() - t0 < deadline_s:
        time.sleep(0.02)
    return time.monotonic() - t0


@pytest.mark.parametrize("path,body", [
    (CHAT, {"messages": USER}),  # patchbay's chat path
    (COMPLETIONS, {"prompt": "The sea is"}),  # 0620's completions path
    (RESPONSES, {"input": "The sea is"}),
], ids=["chat", "completions", "responses"])
def test_a_client_that_leaves_a_non_streamed_request_frees_its_slot(server_on, path, body):
    url = server_on.url
    length = "max_output_tokens" if path == RESPONSES else "max_tokens"
    body = {**body, length: 400, "stream": False}

    def send(rid: str, timeout: float):
        try:
            return httpx.post(f"{url}{path}", json=body, headers={"x-request-id": rid}, timeout=timeout)
        except httpx.TimeoutException:
            return None

    # Paired in one run: four such requests to their end, then four whose clients leave at 0.3 s.
    assert _until_idle(url) < 60
    t0 = time.monotonic()
    full = [threading.Thread(target=send, args=(f"full-{path}-{i}", 120)) for i in range(4)]
    for t in full:
        t.start()
    for t in full:
        t.join()
    full_s = time.monotonic() - t0
    left = [threading.Thread(target=send, args=(f"left-{path}-{i}", 0.3)) for i in range(4)]
    for t in left:
        t.start()
    for t in left:
        t.join()
    gone_s = _until_idle(url)
    print(f"{path}: four to their end {full_s:.2f} s; slots free {gone_s:.2f} s after the clients left")
    assert gone_s < full_s / 2, (gone_s, full_s)
    lines = {line["id"]: line for line in log_lines(server_on, "pb-request ") if line["id"].startswith("left-")}
    assert all(lines[f"left-{path}-{i}"]["cancelled"] for i in range(4)), lines


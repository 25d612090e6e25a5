"""0920 PB_CANCELLED_OUTPUTS: requests whose clients went away leave nothing in the engine.

Two servers of the local set on the tiny model, the knob off and on. Clients close streams of
chat completions (patchbay's chat path), of completions and of responses (upstream's streamed
path) after a few chunks, and give up non-streamed chat requests before they end. Once the engine
runs nothing, /metrics' gauges say what stayed: without the knob, outputs nobody takes on the
engine's shared queue and handlers of cancelled streams; with it, none. Replies after that are
the same on both servers.
"""

import json
import time

import httpx
import pytest

from .conftest import ALL_ON, Server
from .test_metrics import scrape

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def servers(patched_engine, tiny_model, tmp_path_factory):
    """{knob value: server}: the local set with 0920 off and on."""
    made = {value: Server(patched_engine, tiny_model, {**ALL_ON, "PB_CANCELLED_OUTPUTS": value},
                          tmp_path_factory.mktemp(f"run-cancelled-{value}")) for value in ("0", "1")}
    yield made
    for server in made.values():
        server.stop()


def leave_stream(url: str, path: str, body: dict, chunks: int = 3) -> int:
    """Stream `body` to `path` and close the connection after `chunks` data lines; the lines read."""
    read = 0
    with httpx.stream("POST", f"{url}{path}", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                read += 1
                if read == chunks:
                    break
    return read


def give_up(url: str, body: dict) -> None:
    """A non-streamed chat request abandoned after 0.2 s."""
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{url}/v1/chat/completions", json=body, timeout=0.2)


def left_behind(server) -> dict:
    """The gauges once the engine runs no request (waiting up to 30 s)."""
    deadline = time.monotonic() + 30
    while True:
        values = scrape(server)
        if values[("pb_requests_running", ())] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # the last step's outputs are routed after its requests leave the scheduler
    values = scrape(server)
    return {"running": values[("pb_requests_running", ())], "unclaimed": values[("pb_outputs_unclaimed", ())],
            "handlers": values[("pb_output_handlers", ())]}


def traffic(url: str, model: str) -> None:
    long = {"max_tokens": 400, "ignore_eos": True}
    for i in range(4):
        text = f"Client {i} leaves: tell a long story about the harbour."
        assert leave_stream(url, "/v1/chat/completions",
                            {"model": model, "messages": [{"role": "user", "content": text}], **long}) == 3
        assert leave_stream(url, "/v1/completions", {"model": model, "prompt": text, **long}) == 3
        assert leave_stream(url, "/v1/responses", {"model": model, "input": text, "max_output_tokens": 400}) == 3
        give_up(url, {"model": model, "messages": [{"role": "user", "content": text}], **long})


def test_clients_that_leave_leave_nothing_with_the_knob(servers, tiny_model):
    left = {}
    for value, server in servers.items():
        traffic(server.url, tiny_model)
        left[value] = left_behind(server)
    # without the knob: the last outputs of patchbay's paths queued for nobody, upstream's
    # streamed responses' handlers still registered
    assert left["0"]["running"] == 0 and left["0"]["unclaimed"] > 0 and left["0"]["handlers"] > 0, left
    assert left["1"] == {"running": 0, "unclaimed": 0, "handlers": 0}, left
    body = {"model": tiny_model, "messages": [{"role": "user", "content": "Afterwards: the sea."}], "max_tokens": 12}
    replies = [httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=120).json() for s in servers.values()]
    assert replies[0]["pb_fingerprint"] == replies[1]["pb_fingerprint"], json.dumps(replies)[:500]
    assert replies[1]["usage"]["completion_tokens"] > 0

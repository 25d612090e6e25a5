"""0580 PB_METRICS against a live server: /metrics moves by what the responses said, /health,
the `pb-request` log line, SIGUSR1's stacks. The knob both ways is in test_patches_live.py.

The requests here run one at a time on the session's `server_on`, so a counter's change
between two scrapes is these requests' alone.
"""

import json
import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.engine

CHAT = [{"role": "user", "content": "Write a haiku about metrics."}]


def scrape(server) -> dict:
    """{(sample name, labels as a sorted tuple): value} of one /metrics scrape."""
    r = httpx.get(f"{server.url}/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def delta(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def post(server, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json={"model": server.model, **body}, headers=headers, timeout=120)


def stream(server, path: str, body: dict, **headers) -> list[dict]:
    body = {"model": server.model, **body, "stream": True}
    with httpx.stream("POST", f"{server.url}{path}", json=body, headers=headers, timeout=120) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def log_lines(server, prefix: str) -> list[dict]:
    return [json.loads(line.split(prefix, 1)[1]) for line in server.files.log.read_text().splitlines()
            if prefix in line]


def request_line(server, request_id: str, timeout: float = 10) -> dict:
    """The `pb-request` line of one request (written once its response ended)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [line for line in log_lines(server, "pb-request ") if line["id"] == request_id]
        if found:
            assert len(found) == 1
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no pb-request line for {request_id}")


def test_counters_move_by_what_the_responses_said(server_on):
    before = scrape(server_on)
    whole = post(server_on, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 6}).json()
    chunks = stream(server_on, "/v1/completions", {"prompt": "def main():", "max_tokens": 7,
                                                   "stream_options": {"include_usage": True}})
    streamed = chunks[-1]["usage"]
    after = scrape(server_on)

    for route in ("/v1/chat/completions", "/v1/completions"):
        assert delta(before, after, "pb_requests_total", route=route, status="200") == 1
        assert delta(before, after, "pb_request_duration_seconds_count", route=route) == 1
    assert delta(before, after, "pb_prompt_tokens_total") == whole["usage"]["prompt_tokens"] + streamed["prompt_tokens"]
    assert delta(before, after, "pb_completion_tokens_total") == \
        whole["usage"]["completion_tokens"] + streamed["completion_tokens"]
    for phase in ("pb_time_to_first_token_seconds", "pb_request_admit_seconds", "pb_request_queue_seconds"):
        assert delta(before, after, f"{phase}_count") == 2  # one a request, streamed or not
    assert 0 < delta(before, after, "pb_request_admit_seconds_sum") + delta(before, after, "pb_request_queue_seconds_sum") \
        < delta(before, after, "pb_time_to_first_token_seconds_sum")
    # Every streamed token after the first is one gap; the reply that was not streamed adds none.
    assert delta(before, after, "pb_inter_token_seconds_count") == streamed["completion_tokens"] - 1
    assert delta(before, after, "pb_errors_total", code="400") == 0
    # Both finished: nothing runs or waits; the cache's blocks are counted.
    assert after[("pb_requests_running", ())] == 0 and after[("pb_requests_waiting", ())] == 0
    total = after[("pb_kv_blocks_total", ())]
    assert total > 0 and 0 <= after[("pb_kv_blocks_used", ())] <= total
    assert after[("pb_cuda_graphs", ())] == 0  # read from the engine: a CPU server captures none
    assert after[("pb_requests_total", (("route", "/metrics"), ("status", "200")))] >= 1


def test_errors_count_by_code(server_on):
    before = scrape(server_on)
    long = [{"role": "user", "content": " ".join(f"w{i}" for i in range(900))}]
    r = post(server_on, "/v1/chat/completions", {"messages": long, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert httpx.get(f"{server_on.url}/no-such-route", timeout=30).status_code == 404
    after = scrape(server_on)
    assert delta(before, after, "pb_errors_total", code="context_length_exceeded") == 1
    assert delta(before, after, "pb_errors_total", code="not_found") == 1  # 0500 gives a 404 its code
    assert delta(before, after, "pb_requests_total", route="/v1/chat/completions", status="400") == 1
    assert delta(before, after, "pb_requests_total", route="unmatched", status="404") == 1  # no path as a label
    assert delta(before, after, "pb_prompt_tokens_total") == 0


def test_prefix_cache_hits_are_the_cached_tokens_reported(server_on):
    # The same long prompt twice: the second finds the first's blocks (upstream's block sharing).
    messages = [{"role": "user", "content": " ".join(f"token{i}" for i in range(120))}]
    before = scrape(server_on)
    replies = [post(server_on, "/v1/chat/completions", {"messages": messages, "max_tokens": 2}).json()
               for _ in range(2)]
    after = scrape(server_on)
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies]
    assert cached[1] > 0, replies[1]["usage"]
    assert delta(before, after, "pb_prefix_cache_hit_tokens_total") == sum(cached)


def test_health_reports_engine_tokens_and_ranks(server_on):
    r = httpx.get(f"{server_on.url}/health", timeout=5)
    assert r.status_code == 200
    health = r.json()
    assert health["status"] == "ok" and "reason" not in health
    assert health["uptime_s"] > 0
    assert health["requests"] == {"running": 0, "waiting": 0}
    assert health["ranks"] == {"world_size": 1, "peer_lost": None}
    metrics = scrape(server_on)
    assert health["tokens"] == {"prompt": metrics[("pb_prompt_tokens_total", ())],
                                "completion": metrics[("pb_completion_tokens_total", ())]}
    assert health["tokens"]["completion"] > 0  # the readiness check's token at least


def test_log_line_matches_the_response(server_on):
    whole = post(server_on, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 5},
                 **{"x-request-id": "metrics-whole"})
    body = whole.json()
    line = request_line(server_on, "metrics-whole")
    assert line["route"] == "/v1/chat/completions" and line["status"] == 200 and line["cancelled"] is False
    assert line["prompt_tokens"] == body["usage"]["prompt_tokens"]
    assert line["completion_tokens"] == body["usage"]["completion_tokens"]
    assert line["fingerprint"] == body["pb_fingerprint"]
    assert line["finish_reason"] == body["choices"][0]["finish_reason"]
    assert 0 < line["ttft_s"] <= line["duration_s"]
    # the first token's time begins with its way into the engine and its wait there
    assert 0 < line["admit_s"] and 0 <= line["queue_s"] and line["admit_s"] + line["queue_s"] < line["ttft_s"]

    *_, finish, final = stream(server_on, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 5, "stream_options":
                                                                   {"include_usage": True}},
                               **{"x-request-id": "metrics-streamed"})
    line = request_line(server_on, "metrics-streamed")
    assert line["fingerprint"] == final["pb_fingerprint"] == body["pb_fingerprint"]  # greedy: the same tokens
    assert line["completion_tokens"] == final["usage"]["completion_tokens"]
    assert line["finish_reason"] == finish["choices"][0]["finish_reason"]
    # Not asked for usage (0610): the line has the engine's count, the finish reason and fingerprint
    *_, last = stream(server_on, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 5},
                      **{"x-request-id": "metrics-no-usage"})
    line = request_line(server_on, "metrics-no-usage")
    assert "usage" not in last and line["completion_tokens"] == 5
    assert line["fingerprint"] == last["pb_fingerprint"] and line["finish_reason"] == last["choices"][0]["finish_reason"]


def test_a_client_that_goes_away_is_logged_cancelled(server_on):
    body = {"model": server_on.model, "messages": CHAT, "max_tokens": 400, "stream": True}
    with httpx.stream("POST", f"{server_on.url}/v1/chat/completions", json=body, timeout=120,
                      headers={"x-request-id": "metrics-gone"}) as r:
        for i, _ in enumerate(r.iter_lines()):
            if i >= 6:
                break  # a few tokens in, then hang up
    line = request_line(server_on, "metrics-gone", timeout=30)
    assert line["cancelled"] is True and line["status"] == 200 and line["fingerprint"] is None
    deadline = time.monotonic() + 30
    while httpx.get(f"{server_on.url}/health", timeout=5).json()["requests"]["running"] and \
            time.monotonic() < deadline:
        time.sleep(0.2)  # the engine drops the request at its next step
    assert httpx.get(f"{server_on.url}/health", timeout=5).json()["requests"] == {"running": 0, "waiting": 0}


def test_sigusr1_dumps_every_thread_and_the_server_carries_on(server_on):
    pid = int(server_on.files.pid.read_text())
    seen = server_on.files.log.stat().st_size
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        text = server_on.files.log.read_bytes()[seen:].decode(errors="replace")
        if "pb-threads " in text:
            break
        time.sleep(0.1)
    assert "Thread 0x" in text and "(most recent call first)" in text
    names = json.loads(text.split("pb-threads ", 1)[1].splitlines()[0])
    loop = [ident for ident, name in names.items() if "_run_generation_loop" in name]
    assert loop, names  # the batching thread, by name, and its stack
    assert f"Thread {loop[0]}" in text
    assert "in _run_generation_loop" in text.split(f"Thread {loop[0]}", 1)[1]
    r = post(server_on, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] > 0

"""`patchbay soak`: the classification of answers, the RSS growth rule and the other checks on
hand-made records (quick), and a short soak of a server of its own (engine tier; never the shared
`server_on`, which a soak's malformed requests might break for the tests after it)."""

import json
import sys
from pathlib import Path

import pytest

from patchbay import cli
from patchbay.measure import soak, soak_plan, soak_report, verbs


def rec(kind="chat", status=200, outcome="completed", bad=False, accept=("2xx",), t=0.0, latency=0.1, **kw):
    return {"kind": kind, "status": status, "outcome": outcome, "bad": bad, "accept": list(accept),
            "t_start": t, "latency_s": latency, "error": kw.pop("error", None), "openai_shape": None, **kw}


def bad(status, kind="bad_messages_type", outcome="refused", accept=("4xx",), **kw):
    return rec(kind, status, outcome, bad=True, accept=accept, **kw)


@pytest.mark.parametrize("record, expected", [
    (rec(), "ok"),
    (rec(status=500, outcome="refused"), "5xx"),
    (rec(status=503, outcome="refused"), "5xx"),
    (rec(status=400, outcome="refused"), "4xx_for_good"),
    (rec(status=None, outcome="timeout"), "timeout"),
    (rec(status=None, outcome="connection"), "connection"),
    (rec(status=200, outcome="stream_error"), "stream_error"),
    (rec(status=200, outcome="bad_body"), "bad_body"),
    (rec("disconnect_stream", 200, "closed"), "disconnected"),
    (rec("disconnect_timeout", None, "closed"), "disconnected"),
    (bad(400), "expected_4xx"),
    (bad(422, "bad_malformed_json"), "expected_4xx"),
    (bad(200, outcome="completed"), "2xx_for_bad"),
    (bad(500), "5xx"),
    (bad(503), "5xx"),
    (bad(None, outcome="timeout"), "timeout"),
    (bad(200, "bad_huge_max_tokens", "closed", ("2xx", "4xx")), "disconnected"),
    (bad(400, "bad_huge_max_tokens", "refused", ("2xx", "4xx")), "expected_4xx"),
    (bad(200, "bad_empty_prompt", "completed", ("2xx", "4xx")), "ok"),
    (bad(503, "bad_empty_prompt", "refused", ("2xx", "4xx")), "5xx"),
])
def test_each_answer_is_classified_by_its_record_alone(record, expected):
    assert soak_report.classify(record) == expected
    assert (expected in soak_report.EXPECTED) == (record not in soak_report.unexpected([record]))


LIMITS = {"max_unexpected": 0, "max_leaked": 0, "max_rss_growth": 0.05}


def samples(rss_at, seconds=600, every=2.0):
    return [{"t": i * every, "rss_kib": rss_at(i * every), "running": 0} for i in range(int(seconds / every) + 1)]


def test_rss_growth_compares_the_first_minutes_median_with_the_last():
    flat = soak_report.rss_growth(samples(lambda t: 1_000_000 + (5000 if int(t) % 10 == 0 else 0)))
    assert flat["judged"] and flat["window_s"] == 60 and flat["growth"] == 0
    leak = soak_report.rss_growth(samples(lambda t: 1_000_000 * (1 + 0.1 * t / 600)))  # +10 % over the run
    assert leak["judged"] and leak["first_kib"] == pytest.approx(1_005_000) and leak["growth"] > 0.08
    spike = soak_report.rss_growth(samples(lambda t: 2_000_000 if 300 < t < 310 else 1_000_000))
    assert spike["growth"] == 0  # a medians' rule: one burst in the middle is no growth
    for growth, passes in ((leak, False), (flat, True)):
        check = soak_report.checks([], {"pid": 1}, growth, LIMITS)[2]
        assert check["name"] == "RSS growth" and check["ok"] is passes, check
    assert soak_report.checks([], {"pid": 1}, leak, {**LIMITS, "max_rss_growth": 0.2})[2]["ok"]


def test_a_short_runs_windows_are_a_third_of_it_and_too_few_samples_are_not_judged():
    short = soak_report.rss_growth(samples(lambda t: 1000 + t, seconds=30, every=1.0))
    assert short["window_s"] == 10 and short["judged"]
    assert short["first_kib"] == 1005 and short["last_kib"] == 1025  # medians of 0-10 s and 20-30 s
    few = soak_report.rss_growth(samples(lambda t: 1000, seconds=4, every=2.0))
    assert not few["judged"] and "3 RSS sample(s)" in few["reason"]
    none = soak_report.rss_growth([{"t": 0, "rss_kib": None, "running": None}])
    check = soak_report.checks([], {"pid": None}, none, LIMITS)[2]
    assert check["ok"] and check["detail"] == "not judged: not sampled (give --run-dir or --pid)"


def test_unexpected_answers_leaked_slots_and_a_dead_server_fail_the_soak():
    records = [rec(), bad(400), rec("disconnect_stream", 200, "closed"), rec(status=500, outcome="refused", t=3.0,
                                                                          error="Internal Server Error")]
    facts = {"pid": 7, "clients": 2, "duration_s": 30, "samples": [], "running_after": None, "server_alive": True}
    summary = soak_report.summarize(records, facts, LIMITS)
    assert summary["unexpected"] == 1 and not summary["ok"]
    assert summary["checks"][0]["detail"] == "1 of 4 (1 5xx); allowed 0"
    assert summary["examples"] == [{"kind": "chat", "class": "5xx", "status": 500, "t_start": 3.0,
                                    "error": "Internal Server Error"}]
    assert summary["kinds"]["chat"]["categories"] == {"ok": 1, "5xx": 1}
    assert summary["headline"].endswith("FAIL (unexpected answers)")
    assert soak_report.summarize(records, facts, {**LIMITS, "max_unexpected": 1})["ok"]
    slots = soak_report.checks(records[:2], {**facts, "running_after": None}, soak_report.rss_growth([]), LIMITS)
    assert slots[1]["ok"] and slots[1]["detail"].startswith("not reported")
    leaked = soak_report.checks(records[:2], {**facts, "running_after": 2, "running_source": "/metrics"},
                                soak_report.rss_growth([]), LIMITS)
    assert not leaked[1]["ok"] and leaked[1]["detail"].startswith("2 request(s) still running")
    dead = soak_report.checks(records[:2], {**facts, "server_alive": False}, soak_report.rss_growth([]), LIMITS)
    assert dead[-1] == {"name": "server alive", "ok": False, "detail": "pid 7 exited during the soak"}
    left = {"pb_output_handlers": 4, "pb_outputs_unclaimed": 11}
    behind = [c for c in soak_report.checks(records[:2], {**facts, "left_after": left}, soak_report.rss_growth([]),
                                            LIMITS) if c["name"] == "left behind"]
    assert behind == [{"name": "left behind", "ok": False, "detail": "pb_output_handlers 4, pb_outputs_unclaimed 11 "
                                                                      "after the run; allowed 0 in all"}]
    clean = {**facts, "left_after": dict.fromkeys(left, 0)}
    assert soak_report.summarize(records[:2], clean, LIMITS)["ok"]
    assert [c["ok"] for c in slots if c["name"] == "left behind"] == [True]  # not reported: passes


def test_latency_is_bucketed_by_start_time_per_kind_with_the_bad_cases_as_one():
    records = [rec(t=t, latency=lat) for t, lat in ((1, 0.1), (2, 0.3), (12, 1.0))] + [bad(400, t=3, latency=0.01),
                                                                                       rec(status=500, t=4)]
    buckets = soak_report.latency_buckets(records, 10)
    assert buckets == [{"group": "bad", "t0_s": 0, "n": 1, "p50_s": 0.01, "p95_s": 0.01},
                       {"group": "chat", "t0_s": 0, "n": 2, "p50_s": pytest.approx(0.2), "p95_s": pytest.approx(0.29)},
                       {"group": "chat", "t0_s": 10, "n": 1, "p50_s": 1.0, "p95_s": 1.0}]
    assert soak_report.bucket_size(30) == 5 and soak_report.bucket_size(3600) == 60


def test_the_running_count_is_read_from_metrics_or_health_and_may_be_absent():
    metrics = ("# HELP pb_requests_running Requests in the engine.\n# TYPE pb_requests_running gauge\n"
               'pb_requests_running{route="chat"} 2.0\npb_requests_running{route="completions"} 1.0\n'
               "pb_requests_running_total 99\n")
    assert soak.running_from(metrics, {"requests": {"running": 7}}) == (3, "/metrics pb_requests_running")
    assert soak.running_from("pb_requests_running 0\n", None) == (0, "/metrics pb_requests_running")
    assert soak.running_from(None, {"status": "ok", "requests": {"running": 0}}) == (0, "/health requests.running")
    for health in ({"status": "ok"}, {"requests": {"running": True}}, ["x"], None):
        assert soak.running_from("process_resident_memory_bytes 1e9\n", health) == (None, None)


def test_what_requests_left_behind_is_read_from_metrics_or_is_absent():
    metrics = ("# TYPE pb_outputs_unclaimed gauge\npb_outputs_unclaimed 3.0\npb_output_handlers 2.0\n"
               "pb_requests_running 0.0\n")
    assert soak.left_behind_from(metrics) == {"pb_outputs_unclaimed": 3, "pb_output_handlers": 2}
    assert soak.left_behind_from("pb_output_handlers 0\n") == {"pb_output_handlers": 0}
    assert soak.left_behind_from("pb_requests_running 0\n") is None and soak.left_behind_from(None) is None


def test_the_summary_has_a_row_per_bucket_of_rss_running_and_latency():
    records = [rec(t=1, latency=0.1), rec("chat_stream", t=6, latency=0.2), bad(400, t=7, latency=0.01)]
    smp = [{"t": t, "rss_kib": 1024 * (100 + t), "running": t % 3} for t in range(10)]
    facts = {"pid": 7, "clients": 1, "duration_s": 10, "samples": smp, "running_after": 0,
             "running_source": "/metrics pb_requests_running", "server_alive": True}
    summary = soak_report.summarize(records, facts, LIMITS, bucket_s=5)
    assert summary["latency"]["server"] == [{"t0_s": 0, "rss_mib": 102.0, "running_max": 2},
                                            {"t0_s": 5, "rss_mib": 107.0, "running_max": 2}]
    assert soak_report.time_table(summary) == [
        "| from s | RSS MiB | running (max) | chat p50 / p95 ms | chat_stream p50 / p95 ms | bad p50 / p95 ms |",
        "|---:|---:|---:|---:|---:|---:|",
        "| 0 | 102 | 2 | 100 / 100 | – | – |",
        "| 5 | 107 | 2 | – | 200 / 200 | 10 / 10 |"]
    assert summary["checks"][1]["detail"].startswith("0 request(s) still running")
    assert [c["name"] for c in summary["checks"]] == ["unexpected answers", "leaked slots", "RSS growth", "left behind"]
    assert [c["ok"] for c in summary["checks"]] == [True, True, False, True]  # 101 -> 108 MiB is +7 %


def test_the_first_draws_send_every_kind_and_no_two_prompts_alike():
    traffic = soak_plan.Traffic("m", soak_plan.DEFAULT_MIX, list(soak_plan.BAD_CASES), 8, 20, 3, 0.2)
    sent = [traffic.next() for _ in range(len(traffic.kinds()))]
    assert sorted(r.kind for r in sent) == sorted(traffic.kinds())
    assert {f"bad_{c}" for c in soak_plan.BAD_CASES} <= {r.kind for r in sent}
    served_too = {r.kind for r in sent if r.bad and "2xx" in r.accept}
    assert served_too == {"bad_missing_prompt", "bad_empty_prompt", "bad_huge_max_tokens"}
    texts = [json.dumps(r.body) for r in (traffic.next() for _ in range(200)) if not r.bad]
    assert len(set(texts)) == len(texts)
    quiet = soak_plan.Traffic("m", soak_plan.parse_mix(None, no_bad=True), list(soak_plan.BAD_CASES), 8, 20, 3, 0.2)
    assert not any(quiet.next().bad for _ in range(200))


def test_the_verbs_input_is_checked(capsys):
    assert soak_plan.parse_duration("45s") == 45 and soak_plan.parse_duration("1.5h") == 5400
    assert soak_plan.parse_duration("2") == 120
    assert soak_plan.parse_mix("chat=1,bad=2") == {**{f: 0 for f in soak_plan.FAMILIES}, "chat": 1, "bad": 2}
    assert verbs.run("soak", ["--url", "http://10.1.2.3:8000"]) == 2
    assert "10.1.2.3 is not a loopback address" in capsys.readouterr().err
    for argv, message in ((["--mix", "chat=x"], "--mix chat=x: the weight must be a number"),
                          (["--bad", "nope"], "--bad nope: unknown case(s) nope (known: messages_type,"),
                          (["--duration", "soon"], "--duration soon: expected a positive time"),
                          (["--pid", "1", "--run-dir", "x"], "give --pid or --run-dir")):
        assert verbs.run("soak", ["--url", "http://127.0.0.1:1", *argv]) == 2
        assert message in capsys.readouterr().err
    soak_plan.check_loopback("http://localhost:8000", False)
    soak_plan.check_loopback("http://[::1]:8000", False)
    soak_plan.check_loopback("http://10.1.2.3:8000", True)


# ---- a real server of its own ---------------------------------------------------------------

GOOD_BAD_CASES = "messages_type,max_tokens_type,empty_messages,unknown_tool_choice,schema_type,huge_max_tokens"


@pytest.fixture(scope="module")
def soak_server(patched_engine, tiny_model, tmp_path_factory):
    from ..conftest import ALL_ON, Server

    server = Server(patched_engine, tiny_model, ALL_ON, tmp_path_factory.mktemp("run-soak"))
    yield server
    server.stop()


def test_a_short_soak_counts_every_kind_and_writes_its_window(soak_server, tmp_path, capsys, monkeypatch):
    # Only bad cases the engine already refuses well, so a pass here means the good traffic held up.
    args = ["--url", soak_server.url, "--run-dir", str(soak_server.files.dir), "--clients", "4",
            "--duration", "20s", "--max-tokens", "8", "--prompt-words", "20", "--bad", GOOD_BAD_CASES,
            "--sample-every", "1", "--grace", "10", "--timeout", "30", "--window", "ci-soak",
            "--results-dir", str(tmp_path), "--quiet"]
    monkeypatch.setattr(sys, "argv", [str(Path(cli.__file__).with_name("__main__.py")), "soak", *args])
    code = verbs.run("soak", args)
    out = capsys.readouterr().out
    window = tmp_path / "W01-ci-soak"
    summary = json.loads((window / "summary.json").read_text())
    assert code == (0 if summary["ok"] else 1), out
    kinds = summary["kinds"]
    expected_kinds = [k for fam in soak_plan.FAMILIES.values() for k in fam] + \
        [f"bad_{c}" for c in GOOD_BAD_CASES.split(",")]
    assert sorted(kinds) == sorted(expected_kinds), out
    raw = [json.loads(line) for line in (window / "raw.jsonl").read_text().splitlines()]
    assert len(raw) == summary["requests"] == sum(k["requests"] for k in kinds.values())
    assert kinds["bad_messages_type"]["categories"] == {"expected_4xx": kinds["bad_messages_type"]["requests"]}
    for kind in ("chat", "chat_stream", "completion", "json_schema", "tool_auto", "tool_required", "response",
                 "response_stream"):
        assert kinds[kind]["categories"] == {"ok": kinds[kind]["requests"]}, (kind, summary["examples"])
    # A disconnecting stream leaves after its third data chunk; a sampled reply that ends first
    # (an end of turn as its first token: the role and finish chunks only) completed, and is ok.
    # A Responses API stream sends several events before its first text, so it always leaves.
    leaving = kinds["disconnect_stream"]["categories"]
    assert set(leaving) <= {"disconnected", "ok"}, summary["examples"]
    assert leaving.get("disconnected", 0) >= 0.9 * kinds["disconnect_stream"]["requests"], leaving
    assert kinds["disconnect_response"]["categories"] == {"disconnected": kinds["disconnect_response"]["requests"]}
    assert summary["rss"]["judged"] and summary["rss"]["pid"] == int(soak_server.files.pid.read_text().split()[0])
    assert summary["running"]["after_grace"] in (None, 0), summary["checks"]
    # the local set has 0920: the disconnects left nothing in the engine
    assert summary["running"]["left_after"] == {"pb_outputs_unclaimed": 0, "pb_output_handlers": 0}
    assert summary["ok"], summary["checks"]
    for name in ("command.txt", "config.json", "machine.json", "samples.json", "SUMMARY.md", "rss.png",
                 "latency.png"):
        assert (window / name).is_file(), name
    assert (window / "command.txt").read_text().startswith("python -m patchbay soak --url")
    assert "## Requests by kind" in (window / "SUMMARY.md").read_text()
    assert out.splitlines()[-2].startswith("soak 4 clients")

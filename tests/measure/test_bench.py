"""`patchbay ab` and results windows: the statistics and window bookkeeping on their own, then a
whole A/B run through the CLI against the live tiny-model server (engine tier)."""

import json
import subprocess
import sys

import httpx
import numpy as np
import pytest

from patchbay import ROOT, cli
from patchbay.measure import bench, prompts, stats, windows

from .helpers import is_png


def patchbay(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "patchbay", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


# ---- statistics ------------------------------------------------------------------------------


def noisy_ratios(n: int, true_ratio: float, seed: int) -> list[float]:
    """Per-rep B/A ratios of two arms whose decode rates differ by `true_ratio`, with rep noise."""
    rng = np.random.default_rng(seed)
    a = 100 * rng.lognormal(0, 0.08, n)
    b = 100 * true_ratio * rng.lognormal(0, 0.08, n)
    return list(b / a)


def test_bootstrap_ci_holds_the_true_ratio_and_narrows_with_more_reps():
    small = stats.bootstrap_ci(noisy_ratios(10, 1.2, seed=1), seed=0)
    large = stats.bootstrap_ci(noisy_ratios(400, 1.2, seed=1), seed=0)
    assert small[0] < 1.2 < small[1]
    assert large[0] < 1.2 < large[1]
    assert large[1] - large[0] < (small[1] - small[0]) / 3


def test_bootstrap_ci_is_seeded():
    values = noisy_ratios(60, 0.9, seed=3)
    assert stats.bootstrap_ci(values, seed=7) == stats.bootstrap_ci(values, seed=7)
    assert stats.bootstrap_ci(values, seed=7) != stats.bootstrap_ci(values, seed=8)
    assert stats.bootstrap_ci([], seed=0) is None


def test_paired_ratio_pairs_by_rep_and_skips_missing():
    out = stats.paired_ratio({0: 100.0, 1: 50.0, 2: 80.0}, {0: 110.0, 1: 60.0, 3: 1.0}, seed=0)
    assert out["pairs"] == 2  # reps 2 and 3 have one arm only
    assert out["ratio"] == pytest.approx((1.1 + 1.2) / 2)
    assert out["ci95"][0] == pytest.approx(1.1) and out["ci95"][1] == pytest.approx(1.2)


def test_order_balanced_ratio_cancels_a_cost_of_going_first():
    # true B/A 1.0; the arm sent first (A on even reps, B on odd) runs 5 % slower: W14's C1 pattern
    a = {0: 95.0, 1: 100.0, 2: 95.0}
    b = {0: 100.0, 1: 95.0, 2: 100.0}
    out = stats.paired_ratio(a, b, seed=0)
    assert out["ratio"] == pytest.approx(100 / 95)  # two of three passes had A first: a false 5 %
    assert out["rounds"] == 1 and out["balanced"] == pytest.approx(1.0)  # rep 2 has no B-first partner
    assert stats.paired_ratio({0: 1.0}, {0: 2.0}, seed=0)["balanced"] is None


def test_decode_rate_leaves_out_the_first_token_and_bursts():
    rec = {"t_start": 0.0, "t_first": 0.5, "t_last": 1.5, "completion_tokens": 11, "prompt_tokens": 100}
    assert stats.decode_tps(rec) == pytest.approx(10.0)
    assert stats.ttft(rec) == 0.5 and stats.prefill_tps(rec) == pytest.approx(200.0)
    assert stats.decode_tps({**rec, "completion_tokens": 1}) is None
    assert stats.decode_tps({**rec, "t_last": 0.5 + stats.BURST_S / 10}) is None  # read in one burst


def reply(arm, fp=None, text="x", rep=0):
    import hashlib

    return {"arm": arm, "rep": rep, "fingerprint": fp, "text_sha256": hashlib.sha256(text.encode()).hexdigest()}


def test_a_different_b_arm_is_reported_unequal():
    same = stats.compare_replies([reply("A", "f1"), reply("A", "f1", rep=1)], [reply("B", "f1")])
    assert same == {"equal": True, "by": "fingerprint", "a_distinct": 1, "b_distinct": 1}
    differ = stats.compare_replies([reply("A", "f1"), reply("A", "f1", rep=1)], [reply("B", "f2"), reply("B", "f1")])
    assert differ["equal"] is False and differ["b_distinct"] == 2
    # No fingerprint from the server: the reply text decides.
    assert stats.compare_replies([reply("A", text="one")], [reply("B", text="one")])["equal"]
    assert not stats.compare_replies([reply("A", text="one")], [reply("B", text="two")])["equal"]
    # Fingerprints on one side only are not comparable with text hashes: text hashes are compared.
    mixed = stats.compare_replies([reply("A", "f1", text="one")], [reply("B", None, text="one")])
    assert mixed["equal"] and mixed["by"] == "text_sha256"
    # Unequal within arm A alone (e.g. batching changed the bits) is unequal too.
    assert not stats.compare_replies([reply("A", "f1"), reply("A", "f9")], [reply("B", "f1")])["equal"]


# ---- planning ---------------------------------------------------------------------------------


def test_arms_from_knobs_and_json():
    assert bench.arms_from_knobs(["PB_SSE_DONE=0,1", "PB_MODE=fast,slow"]) == {
        "A": {"PB_SSE_DONE": 0, "PB_MODE": "fast"}, "B": {"PB_SSE_DONE": 1, "PB_MODE": "slow"}}
    assert bench.arms_from_json("{}", '{"PB_X": 1}') == {"A": {}, "B": {"PB_X": 1}}
    for bad in (["PB_X=1"], ["X=0,1"], ["PB_X=0,1,2"], ["PB_X=,1"]):
        with pytest.raises(bench.BenchError) as err:
            bench.arms_from_knobs(bad)
        assert err.value.code == 2
    with pytest.raises(bench.BenchError):
        bench.arms_from_json("[1]", "{}")


def plan(**kw):
    base = dict(url="http://127.0.0.1:1", model="m", arms={"A": {}, "B": {"PB_X": 1}}, prompts=prompts.PROMPTS[:3],
                levels=[1, 4], reps=3, warmup=1, max_tokens=None)
    return bench.Plan(**{**base, **kw})


def test_schedule_pairs_arms_and_alternates_who_goes_first():
    order = bench.schedule(plan())
    assert len(order) == (1 + 3) * 2 * 2
    assert [r for r, _, _ in order[:4]] == [-1] * 4  # the warmup rep comes first
    for rep in range(-1, 3):
        for level in (1, 4):
            arms = [arm for r, lv, arm in order if r == rep and lv == level]
            assert arms == (["A", "B"] if rep % 2 == 0 else ["B", "A"])


def test_request_body_is_streamed_greedy_and_carries_only_its_arms_knobs():
    p = plan()
    tool = next(x for x in prompts.PROMPTS if x.tools)
    a = bench.request_body(p, tool, "A")
    b = bench.request_body(p, tool, "B")
    assert a["stream"] is True and a["temperature"] == 0 and "pb_knobs" not in a and a["tools"]
    assert b["pb_knobs"] == {"PB_X": 1} and b["max_tokens"] == tool.max_tokens
    assert bench.request_body(plan(max_tokens=7), tool, "A")["max_tokens"] == 7


def test_an_error_event_in_the_stream_is_the_requests_error(tmp_path):
    """A server that fails a request mid-stream sends an error event; the record carries the
    server's message instead of only missing its usage block (a real HTTP server on 127.0.0.1)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    class Failing(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            chunk = {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b'data: {"error": "CUDA out of memory"}\n\n')

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        plan = bench.Plan(url=url, model="m", arms={"A": {}, "B": {}}, prompts=[], levels=[1], reps=1, warmup=0,
                          max_tokens=4)
        with httpx.Client(timeout=30) as client:
            rec = bench.run_request(client, plan, {"model": "m", "messages": [], "stream": True}, 0.0)
    finally:
        server.shutdown()
    assert rec["error"] == 'server error: "CUDA out of memory"'
    assert rec["t_first"] is not None  # what came before the error is kept


def test_cold_requests_each_start_with_a_line_of_their_own():
    prose = next(p for p in prompts.PROMPTS if p.system)  # the first message is the system prompt
    warm = [bench.request_body(plan(), prose, "A")["messages"] for _ in range(2)]
    cold = [bench.request_body(plan(cold=True), prose, arm)["messages"] for arm in "AAB"]
    assert warm[0] == warm[1] == prose.messages()
    firsts = [m[0]["content"] for m in cold]
    assert len(set(firsts)) == 3 and all(f.endswith("\n\n" + prose.system) for f in firsts)
    assert all(m[1:] == prose.messages()[1:] for m in cold)  # only the first message changes


def test_distinct_copies_open_with_their_copy_number_the_same_in_both_arms():
    prose = next(p for p in prompts.PROMPTS if p.system)
    bodies = {(arm, copy): bench.request_body(plan(distinct_copies=True), prose, arm, copy=copy)["messages"]
              for arm in "AB" for copy in range(3)}
    assert bodies[("A", 0)] == prose.messages()  # the first copy is the prompt itself (C1 unchanged)
    assert bodies[("A", 1)][0]["content"] == "Copy 2.\n\n" + prose.system
    assert bodies[("A", 2)][0]["content"].startswith("Copy 3.\n\n")
    assert all(bodies[("A", c)] == bodies[("B", c)] for c in range(3))  # replies stay comparable across arms
    assert bench.request_body(plan(), prose, "A", copy=2)["messages"] == prose.messages()  # off by default
    both = bench.request_body(plan(distinct_copies=True, cold=True), prose, "A", copy=1)["messages"]
    assert both[0]["content"].startswith("Request ") and "\n\nCopy 2.\n\n" in both[0]["content"]


# ---- prompts --------------------------------------------------------------------------------


def test_every_suite_ships_and_has_its_shape():
    assert set(prompts.SUITES) == {"code", "json", "sql", "prose", "edit", "tool", "count", "long", "prefill"}
    assert "prefill" not in {p.suite for p in prompts.select()}  # the 8K-token prompt runs only when named
    assert prompts.select(["prefill"])[0].words() > 8000
    assert len({p.id for p in prompts.PROMPTS}) == len(prompts.PROMPTS)
    edit = prompts.select(["edit"])[0]
    assert 55 <= len(edit.body.splitlines()) <= 70 and edit.body in edit.messages()[-1]["content"]
    assert all(p.tools for p in prompts.select(["tool"]))
    assert prompts.select(["long"])[0].words() > 1200
    with pytest.raises(ValueError, match="unknown suite"):
        prompts.select(["nope"])


def test_fit_cuts_the_body_by_words_and_keeps_the_instruction():
    long = prompts.select(["long"])[0]

    def words(p):  # a stand-in tokenizer: one token per word of the whole user turn
        return len(p.messages()[-1]["content"].split())

    fitted = prompts.fit(long, 300, words)
    assert words(fitted) == 300
    text = fitted.messages()[-1]["content"]
    assert text.startswith(long.instruction) and long.messages()[-1]["content"].startswith(text)
    assert prompts.fit(long, 10**6, words) is long
    with pytest.raises(ValueError, match="instruction alone"):
        prompts.fit(long, 5, words)


# ---- windows ------------------------------------------------------------------------------------


def test_windows_are_numbered_in_order_and_never_overwritten(tmp_path, monkeypatch):
    first = windows.create(tmp_path, "sse-done")
    (first / "raw.jsonl").write_text("keep\n")
    assert first.name == "W01-sse-done"
    assert windows.create(tmp_path, "sse-done").name == "W02-sse-done"
    (tmp_path / "W07-old").mkdir()
    assert windows.create(tmp_path, "next").name == "W08-next"
    # A creator that saw a stale listing (another run took the number first) moves on, never reuses.
    monkeypatch.setattr(windows, "existing", lambda _: [])
    assert windows.create(tmp_path, "sse-done").name == "W03-sse-done"
    assert (first / "raw.jsonl").read_text() == "keep\n"
    with pytest.raises(windows.WindowError):
        windows.create(tmp_path, "Bad Slug")


def fake_records(prompt_ids, levels, reps, rate_b=1.1):
    """Raw records as `ab` writes them, for two arms whose decode rates differ by `rate_b`."""
    out = []
    for rep in range(reps):
        for level in levels:
            for arm, rate in (("A", 100.0), ("B", 100.0 * rate_b)):
                for i, pid in enumerate(prompt_ids):
                    jitter = 1 + 0.01 * ((rep + i) % 3)
                    out.append({"prompt": pid, "arm": arm, "rep": rep, "concurrency": level, "warmup": False,
                                "t_start": 0.0, "t_first": 0.05, "t_last": 0.05 + 20 / (rate * jitter),
                                "completion_tokens": 21, "prompt_tokens": 40, "error": None,
                                "fingerprint": f"fp-{pid}", "text_sha256": "h", "pass_wall_s": 2.0})
    return out


def make_window(results_dir, slug, rate_b=1.1):
    ids = ["p1", "p2"]
    window = windows.create(results_dir, slug)
    config = {"url": "http://127.0.0.1:1", "model": "m", "build": "pb-test", "arms": {"A": {}, "B": {"PB_X": 1}},
              "suites": ["code"], "levels": [1, 2], "reps": 3, "warmup": 0, "max_tokens": 21, "seed": 0,
              "prompts": [{"id": i} for i in ids]}
    windows.write_start(window, f"patchbay ab --window {slug}", config)
    records = fake_records(ids, [1, 2], 3, rate_b)
    windows.append_raw(window, records)
    summary = stats.summarize(records, ids, [1, 2], seed=0)
    summary.update(complete=True, resamples=stats.RESAMPLES, headline=stats.headline(summary))
    windows.write_finish(window, summary)
    return window


def test_a_window_from_records_has_summary_markdown_and_plots(tmp_path):
    window = make_window(tmp_path, "fake")
    summary = json.loads((window / "summary.json").read_text())
    for level in ("1", "2"):
        for row in summary["levels"][level]["prompts"].values():
            assert row["decode"]["ratio"] == pytest.approx(1.1, rel=0.03)
            assert row["replies"]["equal"]
    text = (window / "SUMMARY.md").read_text()
    assert "## Concurrency 2" in text and "| p1 |" in text and "replies equal 2/2" in text
    assert is_png(window / "ratio.png") and is_png(window / "aggregate.png")
    assert len(windows.read_raw(window)) == 2 * 2 * 2 * 3


def test_results_check_fails_while_the_index_is_stale(tmp_path):
    results, index = tmp_path / "results", tmp_path / "docs" / "RESULTS.md"
    args = ["results", "--results-dir", str(results), "--index", str(index)]
    assert cli.main(args + ["--check"]) == 1  # no index yet
    assert cli.main(args) == 0 and "No windows yet" in index.read_text()
    make_window(results, "first")
    assert cli.main(args + ["--check"]) == 1
    assert cli.main(args) == 0 and cli.main(args + ["--check"]) == 0
    text = index.read_text()
    assert "[W01](../results/W01-first/SUMMARY.md)" in text and "`patchbay ab --window first`" in text
    assert "replies equal 2/2" in text


def test_the_repositorys_results_index_is_current():
    assert cli.main(["results", "--check"]) == 0


# ---- a whole run against the live server --------------------------------------------------------


@pytest.mark.engine
def test_ab_same_bits_knob_through_the_cli(server_on, tmp_path):
    results = tmp_path / "results"
    proc = patchbay("ab", "--url", server_on.url, "--model", server_on.model, "--knob", "PB_SSE_DONE=0,1",
                    "--max-prompt-tokens", "420", "--max-tokens", "12", "--reps", "2", "--warmup", "1",
                    "--concurrency", "1,2", "--window", "sse-done", "--results-dir", str(results), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    window = results / "W01-sse-done"
    assert proc.stdout.strip().endswith(f"window {window}")
    for name in ("command.txt", "config.json", "machine.json", "raw.jsonl", "summary.json", "SUMMARY.md"):
        assert (window / name).is_file(), name
    assert "--knob PB_SSE_DONE=0,1" in (window / "command.txt").read_text()
    config = json.loads((window / "config.json").read_text())
    assert config["arms"] == {"A": {"PB_SSE_DONE": 0}, "B": {"PB_SSE_DONE": 1}}
    assert config["build"].startswith("pb-") and config["levels"] == [1, 2]
    assert json.loads((window / "machine.json").read_text())["cpus"] >= 1

    n = len(prompts.select())  # the default suites
    raw = windows.read_raw(window)
    assert len(raw) == n * 2 * (2 + 1) * 2  # prompts x arms x (reps + warmup) x levels
    assert not [r for r in raw if r["error"]]
    assert all(r["fingerprint"] for r in raw)  # the server sends pb_fingerprint
    assert all(r["prompt_tokens"] <= 420 for r in raw)
    assert {r["rep"]: r["first"] for r in raw} == {-1: "B", 0: "A", 1: "B"}

    summary = json.loads((window / "summary.json").read_text())
    assert summary["errors"] == 0 and summary["complete"]
    for level in ("1", "2"):
        rows = summary["levels"][level]["prompts"]
        assert len(rows) == n
        for pid, row in rows.items():
            assert row["decode"]["ratio"] is not None and row["decode"]["ci95"] is not None, (level, pid)
            assert row["replies"]["equal"], (level, pid, row["replies"])
    assert all(c["equal"] for c in summary["replies_all_levels"].values())
    assert "## Concurrency 1" in (window / "SUMMARY.md").read_text()
    assert is_png(window / "ratio.png") and is_png(window / "aggregate.png")

    index = tmp_path / "RESULTS.md"
    assert patchbay("results", "--results-dir", str(results), "--index", str(index)).returncode == 0
    assert "W01" in index.read_text() and "sse-done" in index.read_text()
    assert patchbay("results", "--results-dir", str(results), "--index", str(index), "--check").returncode == 0


@pytest.mark.engine
def test_ab_cold_prompts_are_fitted_with_their_own_first_line(server_on, tmp_path):
    """--cold with the long prefill prompt: every request is its own (a distinct first line), and the
    line counts toward --max-prompt-tokens, so no prompt is longer than asked."""
    proc = patchbay("ab", "--url", server_on.url, "--model", server_on.model, "--knob", "PB_SSE_DONE=0,1",
                    "--suites", "prefill", "--cold", "--max-prompt-tokens", "400", "--max-tokens", "2",
                    "--reps", "2", "--warmup", "0", "--window", "cold", "--results-dir", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    window = tmp_path / "W01-cold"
    raw = windows.read_raw(window)
    assert len(raw) == 4 and not [r for r in raw if r["error"]]
    assert all(370 <= r["prompt_tokens"] <= 400 for r in raw), [r["prompt_tokens"] for r in raw]
    assert json.loads((window / "config.json").read_text())["cold"] is True
    assert "cold: each request starts with a line of its own" in (window / "SUMMARY.md").read_text()


@pytest.mark.engine
def test_ab_refuses_an_arm_the_server_refuses_before_running(server_on, tmp_path):
    proc = patchbay("ab", "--url", server_on.url, "--knob", "PB_MODELS_INFO=0,1", "--suites", "count",
                    "--window", "refused", "--results-dir", str(tmp_path), "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "PB_MODELS_INFO" in proc.stderr and "HTTP 400" in proc.stderr
    assert not list(tmp_path.iterdir())  # no window for a run that never started


@pytest.mark.engine
def test_ab_restarts_two_configs_alternately(tmp_path, patched_engine, tiny_model):
    """Knobs read at start are A/B tested by restarting the server with each arm's config."""
    from patchbay.runtime import config

    from ..conftest import free_port

    base = (config.CONFIG_DIR / "local.env.example").read_text()
    port = free_port()
    a = tmp_path / "a.env"
    b = tmp_path / "b.env"
    a.write_text(base.replace("PORT=8000", f"PORT={port}") + "PB_MODELS_INFO=0\n")  # one knob of the set, off
    b.write_text(base)
    proc = patchbay("ab", "--a-config", str(a), "--b-config", str(b), "--suites", "count", "--max-tokens", "4",
                    "--reps", "2", "--warmup", "0", "--window", "restarts", "--results-dir", str(tmp_path / "r"),
                    "--quiet", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    window = next((tmp_path / "r").iterdir())
    cfg = json.loads((window / "config.json").read_text())
    assert cfg["restarts"]["A"]["knobs"]["PB_MODELS_INFO"] == "0"
    assert cfg["restarts"]["B"]["knobs"]["PB_MODELS_INFO"] == "1"
    raw = [json.loads(line) for line in (window / "raw.jsonl").read_text().splitlines()]
    assert {r["arm"] for r in raw} == {"A", "B"} and not any(r["error"] for r in raw)
    summary = json.loads((window / "summary.json").read_text())
    assert all(row["replies"]["equal"] for row in summary["levels"]["1"]["prompts"].values())
    assert not (ROOT / ".run" / "ab" / "server.pid").exists()  # nothing left running


@pytest.mark.engine
def test_ab_between_two_servers_side_by_side(server_off, server_on, tmp_path):
    """Settings read at start, A/B tested on two live servers: passes still alternate A B A B,
    each arm's requests go to its own server, and the window names both."""
    proc = patchbay("ab", "--url", server_off.url, "--b-url", server_on.url, "--model", server_off.model,
                    "--suites", "count",
                    "--max-tokens", "4", "--reps", "2", "--warmup", "0", "--window", "two-servers",
                    "--results-dir", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    window = next(tmp_path.iterdir())
    cfg = json.loads((window / "config.json").read_text())
    assert cfg["url"] == server_off.url and cfg["b_server"]["url"] == server_on.url
    assert cfg["arms"] == {"A": {}, "B": {}}
    assert cfg["knobs_hash"] != cfg["b_server"]["knobs_hash"]  # the two servers run other knob sets
    raw = windows.read_raw(window)
    assert not any(r["error"] for r in raw)
    # Only the server with PB_FINGERPRINT on sends a fingerprint: each arm went to its own server.
    assert {r["arm"] for r in raw if r["fingerprint"]} == {"B"}
    assert [r["arm"] for r in raw if r["rep"] == 1][0] == "B"  # B first on odd reps


@pytest.mark.engine
def test_ab_refuses_a_b_server_with_another_model(server_off, server_on, tmp_path):
    proc = patchbay("ab", "--url", server_off.url, "--b-url", server_on.url, "--model", "other-model",
                    "--suites", "count", "--window", "x", "--results-dir", str(tmp_path), "--quiet")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not other-model" in proc.stderr and "same model" in proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.engine
def test_ab_b_model_names_another_checkpoint_that_b_must_list(server_off, server_on, tmp_path):
    """--b-model: arm B asks its server for that id (another checkpoint of the model, e.g. its FP8
    copy); a B server that does not list it is refused before the run, and so is --b-model alone."""
    listed = httpx.get(f"{server_on.url}/v1/models").json()["data"][0]["id"]
    proc = patchbay("ab", "--url", server_off.url, "--b-url", server_on.url, "--model", server_off.model,
                    "--b-model", listed, "--suites", "count", "--max-tokens", "2", "--reps", "1", "--warmup", "0",
                    "--window", "b-model", "--results-dir", str(tmp_path), "--quiet")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cfg = json.loads((next(tmp_path.iterdir()) / "config.json").read_text())
    assert cfg["b_server"]["model"] == listed and cfg["model"] == server_off.model
    other = patchbay("ab", "--url", server_off.url, "--b-url", server_on.url, "--model", server_off.model,
                     "--b-model", "other-model", "--suites", "count", "--quiet")
    assert other.returncode == 2 and "not --b-model other-model" in other.stderr, other.stderr
    alone = patchbay("ab", "--url", server_off.url, "--b-model", "x", "--knob", "PB_SSE_DONE=0,1", "--quiet")
    assert alone.returncode == 2 and "give --b-url" in alone.stderr, alone.stderr

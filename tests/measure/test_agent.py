"""`patchbay ab --workload agent`: its prompts, request bodies, schedule and ratios on their own, then a
small run through the CLI against the live tiny-model server (engine tier)."""

import json
import re
import subprocess
import sys

import pytest

from patchbay import ROOT
from patchbay.measure import agent, agent_report, agent_run, verbs, windows
from patchbay.measure.prompts import Prompt

from .helpers import is_png


def chars_count(prompt: Prompt) -> int:
    """A stand-in tokenizer: three characters a token, the tools' JSON counted too."""
    text = "".join(m["content"] for m in prompt.messages()) + (json.dumps(prompt.tools) if prompt.tools else "")
    return len(text) // 3 + 8


# ---- prompts ---------------------------------------------------------------------------------


def test_texts_are_distinct_real_and_fixed_by_the_seed():
    texts = agent.Texts(0)
    bodies = [texts.body(i, 1500)[:1500] for i in range(600)]  # more than the stdlib's files: laps too
    assert len(set(bodies)) == len(bodies)
    assert any(b.startswith("# file: ") and "def " in b for b in bodies)  # standard-library sources
    assert any(not b.startswith("# file: ") for b in bodies)  # and prose
    again = agent.Texts(0)
    assert [again.body(i, 1500)[:1500] for i in range(20)] == bodies[:20]
    assert [agent.Texts(1).body(i, 1500)[:1500] for i in range(20)] != bodies[:20]
    assert len(texts.body(3, 200_000)) >= 200_000  # a long prompt runs on into the next files


def test_tasks_choose_the_instructions_and_keep_the_texts_distinct():
    assert agent.parse_tasks(None) is None
    assert agent.parse_tasks("prose, edit") == ["edit", "prose"]  # TASKS' order
    for bad in ("edit,rewrite", ",", ""):
        with pytest.raises(agent.AgentError, match="known: explain, edit, prose, review, tests"):
            agent.parse_tasks(bad)
    edits = agent.Texts(0, ["edit"])
    assert {edits.task(i)[0] for i in range(40)} == {"edit"}
    bodies = [edits.body(i, 1500)[:1500] for i in range(40)]
    assert len(set(bodies)) == 40 and all(b.startswith("# file: ") for b in bodies)
    prose = agent.Texts(0, ["prose"])
    assert {prose.task(i)[0] for i in range(10)} == {"prose"}
    assert not any(prose.body(i, 1500).startswith("# file: ") for i in range(10))
    both = agent.Texts(0, ["edit", "prose"])
    assert {both.task(i)[0] for i in range(10)} == {"edit", "prose"}
    everything = agent.Texts(0)  # no choice: every task, as before --tasks existed
    assert [everything.task(i) for i in range(10)] == [agent.TASKS[i % len(agent.TASKS)][:2] for i in range(10)]


def test_a_prompt_is_fitted_to_its_target_and_keeps_its_instruction():
    texts = agent.Texts(0)
    for target in (120, 600, 5000):
        for i in range(5):
            p = agent.make_prompt(texts, i, target, chars_count, 3.0, agent.SESSION_SAMPLE)
            assert target * 0.95 <= chars_count(p) <= target, (target, i, chars_count(p))
            assert p.messages()[-1]["content"].startswith(texts.task(i)[1])
            assert p.messages()[0] == {"role": "system", "content": agent.SESSION_SAMPLE}
    with pytest.raises(agent.AgentError, match="instruction alone"):
        agent.make_prompt(texts, 0, 20, chars_count, 3.0, agent.SESSION_SAMPLE)


def test_lengths_fit_the_context_and_say_so():
    wide = agent.fit_lengths(131072, 600, 256, ["greedy", "conversation"], 4, 300, {})
    assert (wide.text_tokens, wide.first_turn_tokens, wide.turn_tokens, wide.notes) == (600, 600, 300, ())
    top = agent.fit_lengths(131072, None, 256, ["greedy"], 4, 300, {})  # --prompt-tokens max
    assert top.text_tokens == 131072 - 256 - 16
    tools = {1: 240, 2: 360, 3: 480, 4: 600}
    small = agent.fit_lengths(512, 600, 16, ["greedy", "tools-required", "conversation"], 4, 300, tools)
    assert small.tools == 1 and small.tools_tokens == 240
    assert small.text_tokens + small.tools_tokens + 16 + 16 <= 512
    assert any("lowered" in n for n in small.notes) and any("1 of the 4 tools" in n for n in small.notes)
    last_turn = small.first_turn_tokens + 3 * (small.turn_tokens + 16 + 16)
    assert last_turn + 16 <= 512 and "conversation" not in small.skipped
    tight = agent.fit_lengths(512, 600, 128, ["greedy", "conversation"], 8, 300, {})
    assert "conversation" in tight.skipped and "lower --turns" in tight.skipped["conversation"]
    unknown = agent.fit_lengths(None, 600, 16, ["greedy", "tools-auto"], 4, 300, {1: 240, 4: 600})
    assert (unknown.text_tokens, unknown.tools) == (600, 4) and "not fitted" in unknown.notes[0]
    with pytest.raises(agent.AgentError, match="does not report its context"):
        agent.fit_lengths(None, None, 16, ["greedy"], 4, 300, {})
    with pytest.raises(agent.AgentError, match="lower --max-tokens"):
        agent.fit_lengths(512, 600, 480, ["greedy"], 4, 300, {})


# ---- modes -----------------------------------------------------------------------------------


def test_each_mode_sends_its_own_fields_and_nothing_else():
    msgs = [{"role": "user", "content": "hi"}]
    bodies = {m: agent.body(m, "tiny", msgs, 64, 7) for m in agent.MODES}
    for b in bodies.values():
        assert b["stream"] is True and b["stream_options"] == {"include_usage": True} and "pb_knobs" not in b
    assert bodies["greedy"]["temperature"] == 0 and "seed" not in bodies["greedy"]
    assert bodies["sampled"] | {} == {**bodies["sampled"], "temperature": 0.7, "top_p": 0.95, "seed": 7}
    assert not {"temperature", "top_p", "top_k", "seed"} & set(bodies["defaults"])  # the model's defaults
    assert bodies["json"]["response_format"]["json_schema"]["schema"] == agent.ANSWER_SCHEMA
    assert bodies["tools-auto"]["tool_choice"] == "auto" and bodies["tools-required"]["tool_choice"] == "required"
    assert len(bodies["tools-auto"]["tools"]) == len(agent.TOOLS)
    assert len(agent.body("tools-auto", "tiny", msgs, 64, 7, tools=1)["tools"]) == 1
    assert bodies["logprobs"]["logprobs"] is True and bodies["logprobs"]["top_logprobs"] == 5
    free = {k: v for k, v in bodies["sampled"].items()}
    for mode in ("json", "tools-required", "logprobs"):  # the free partner's sampling, one field more
        assert {k: v for k, v in bodies[mode].items() if k in free} == free
    assert agent.body("greedy", "tiny", msgs, 64, 7, {"PB_X": 1})["pb_knobs"] == {"PB_X": 1}


def test_modes_parse_and_bring_their_free_partner():
    assert agent.parse_modes("greedy,json") == ["sampled", "greedy", "json"]
    assert agent.parse_modes(None) == list(agent.DEFAULT_MODES)
    with pytest.raises(agent.AgentError, match="unknown mode"):
        agent.parse_modes("greedy,beam")


def test_sessions_differ_by_request_and_arm_while_seeds_pair_the_arms():
    lines = {agent.session_line(0, rep, 4, mode, s, r, arm) for rep in range(2) for mode in ("greedy", "json")
             for s in range(4) for r in range(2) for arm in "AB"}
    assert len(lines) == 2 * 2 * 4 * 2 * 2
    assert len(agent.SESSION_SAMPLE) == len(next(iter(lines)))
    assert agent.request_seed(0, 1, 4, 2, 0) == agent.request_seed(0, 1, 4, 2, 0) != agent.request_seed(1, 1, 4, 2, 0)


def plan(arms=("A", "B"), modes=("greedy", "sampled", "json"), reps=2, warmup=1):
    fitted = agent.fit_lengths(4096, 600, 64, list(modes), 4, 300, {})
    return agent_run.AgentPlan(url="http://x", model="m", arms={a: {} for a in arms}, levels=[1, 8],
                               modes=list(modes), reps=reps, warmup=warmup, max_tokens=64, requests=2, fitted=fitted)


def test_schedule_pairs_arms_per_mode_and_rotates_the_modes():
    order = agent_run.schedule(plan())
    assert len(order) == 3 * 2 * 3 * 2
    assert order[:6] == [(-1, 1, m, a) for m in ("json", "greedy", "sampled") for a in "BA"]
    assert [(m, a) for rep, lv, m, a in order if rep == 0 and lv == 8] == [
        (m, a) for m in ("greedy", "sampled", "json") for a in "AB"]
    one = agent_run.schedule(plan(arms=("A",)))
    assert {a for *_, a in one} == {"A"} and len(one) == 3 * 2 * 3
    grouped = agent_run.schedule(plan(), restarts=True)
    assert [a for rep, _, _, a in grouped if rep == 0] == ["A"] * 6 + ["B"] * 6


# ---- ratios ----------------------------------------------------------------------------------


def records(mode, arm, rep, tokens, wall, streams=2, ttft=0.1):
    """A pass's records: `streams` requests of `tokens` tokens, decoding over the pass's wall less TTFT."""
    return [{"mode": mode, "arm": arm, "rep": rep, "concurrency": 2, "warmup": False, "error": None,
             "pass_wall_s": wall, "t_start": 0.0, "t_first": ttft, "t_last": wall, "completion_tokens": tokens,
             "prompt_tokens": 100, "cached_tokens": 0, "finish_reason": "length", "turn": 0, "stream": s}
            for s in range(streams)]


def test_ratios_pair_modes_and_arms_by_rep():
    recs = []
    for rep in range(4):
        recs += records("greedy", "A", rep, 100, 1.0) + records("sampled", "A", rep, 100, 1.25)
        recs += records("greedy", "B", rep, 100, 0.5) + records("sampled", "B", rep, 100, 0.625, ttft=0.2)
    recs += [{**records("greedy", "A", 0, 1, 1.0)[0], "error": "HTTP 500", "completion_tokens": None}]
    out = agent_report.summarize(recs, [2], ["greedy", "sampled"], ["A", "B"], seed=0)
    level = out["levels"]["2"]
    assert level["modes"]["greedy"]["A"]["aggregate_tps"] == pytest.approx(200.0)
    assert level["modes"]["greedy"]["A"]["failed"] == 1 and out["errors"] == 1
    for arm in "AB":
        assert level["ratios"]["sampled/greedy"][arm]["aggregate"]["ratio"] == pytest.approx(0.8)
        assert level["ratios"]["sampled/greedy"][arm]["aggregate"]["pairs"] == 4
    assert level["b_over_a"]["greedy"]["aggregate"]["ratio"] == pytest.approx(2.0)
    assert level["b_over_a"]["sampled"]["ttft"]["ratio"] == pytest.approx(2.0)
    assert level["b_over_a"]["greedy"]["decode"]["ci95"] == pytest.approx((99 / 0.4 / (99 / 0.9),) * 2)
    assert "sampled/greedy ×0.800" in out["headline"] and "B/A greedy ×2.000" in out["headline"]


def test_the_window_has_its_tables_and_plots(tmp_path):
    recs = []
    for rep in range(2):
        recs += records("sampled", "A", rep, 50, 1.0) + records("json", "A", rep, 50, 2.0)
        recs += [{**r, "mode": "conversation", "turn": t} for t in range(3) for r in records("conversation", "A", rep, 50, 1.0)]
    window = windows.create(tmp_path, "agent-test")
    fitted = agent.fit_lengths(512, 600, 16, ["sampled", "json", "conversation"], 3, 300, {})
    config = {"url": "http://x", "model": "m", "build": "pb-x", "arms": {"A": {}}, "modes": ["sampled", "json",
              "conversation"], "skipped": {}, "levels": [2], "reps": 2, "warmup": 0, "max_tokens": 16,
              "requests_per_stream": 2, "turns": 3, "seed": 0, "context": 512,
              "fitted": {"text_tokens": fitted.text_tokens, "tools": 0, "tools_tokens": 0, "notes": list(fitted.notes),
                         "first_turn_tokens": fitted.first_turn_tokens, "turn_tokens": fitted.turn_tokens}}
    windows.write_start(window, "python -m patchbay ab --workload agent", config)
    summary = agent_report.summarize(recs, [2], ["sampled", "json", "conversation"], ["A"], seed=0)
    agent_report.write_finish(window, summary, config)
    text = (window / "SUMMARY.md").read_text()
    assert "| json/free | A | 0.500 [0.500, 0.500]" in text and "turn by turn" in text
    assert "lowered" in text
    for name in ("aggregate.png", "ratios.png"):
        assert is_png(window / name)


# ---- the command line ------------------------------------------------------------------------


def test_flags_of_one_workload_are_refused_with_the_other(capsys):
    assert verbs.run("ab", ["--url", "http://127.0.0.1:9", "--workload", "agent", "--suites", "code"]) == 2
    assert "--suites: not flags of --workload agent" in capsys.readouterr().err
    assert verbs.run("ab", ["--url", "http://127.0.0.1:9", "--knob", "PB_X=0,1", "--modes", "json"]) == 2
    assert "--modes: flags of --workload agent" in capsys.readouterr().err
    assert verbs.run("ab", ["--url", "http://127.0.0.1:9", "--knob", "PB_X=0,1", "--tasks", "edit"]) == 2
    assert "--tasks: flags of --workload agent" in capsys.readouterr().err
    assert verbs.run("ab", ["--url", "http://127.0.0.1:9", "--workload", "agent", "--tasks", "rewrite"]) == 2
    assert "--tasks rewrite: unknown task(s) rewrite" in capsys.readouterr().err
    assert verbs.run("ab", ["--url", "http://127.0.0.1:9", "--workload", "agent", "--prompt-tokens", "lots"]) == 2
    assert "--prompt-tokens lots" in capsys.readouterr().err


def test_the_device_ab_job_passes_the_agent_flags_through():
    from patchbay.device.__main__ import parser

    argv = ["ab", "--cuda-graphs", "--", "--workload", "agent", "--modes", "greedy,sampled,json", "--concurrency",
            "1,8,32", "--prompt-tokens", "max", "--turns", "6", "--reps", "2"]
    args = parser().parse_args(argv)
    ab_args = [a for a in args.ab_args if a != "--"]
    assert ab_args == argv[3:]
    import argparse

    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="verb")
    verbs.add_verbs(lambda name, fn, help: sub.add_parser(name))
    parsed = p.parse_args(["ab", "--url", "http://x", "--model", "air12", *ab_args])
    assert (parsed.workload, parsed.modes, parsed.prompt_tokens, parsed.turns) == ("agent", "greedy,sampled,json",
                                                                                   "max", 6)


def test_graphs_captured_sum_each_arms_measured_passes_once():
    def rec(arm, rep, mode, captured):
        return {"arm": arm, "rep": rep, "concurrency": 8, "mode": mode, "graphs_captured": captured}

    measured = [rec("A", 0, "greedy", 3), rec("A", 0, "greedy", 3),  # two requests of one pass
                rec("A", 1, "greedy", 0), rec("A", 0, "logprobs", 2), rec("B", 0, "greedy", None),
                rec("B", 1, "greedy", 4)]
    assert agent_report.graphs_captured(measured, ["A", "B"]) == {"A": 5, "B": None}
    assert agent_report.graphs_captured([], ["A"]) == {"A": None}


# ---- against the tiny model --------------------------------------------------------------------


@pytest.mark.engine
def test_agent_workload_through_the_cli(server_on, tmp_path):
    """C1 and C2, two reps, every mode the 512-token tiny model can hold, tiny replies: every request
    succeeds and the window holds its records, summary, tables and plots."""
    modes = "greedy,sampled,defaults,json,tools-auto,tools-required,logprobs,conversation"
    proc = subprocess.run([sys.executable, "-m", "patchbay", "ab", "--url", server_on.url, "--model", server_on.model,
                           "--workload", "agent", "--modes", modes, "--concurrency", "1,2", "--reps", "2",
                           "--warmup", "0", "--max-tokens", "8", "--requests", "1", "--turns", "3",
                           "--prompt-tokens", "600", "--results-dir", str(tmp_path), "--window", "agent"],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lowered to" in proc.stderr  # 600 tokens do not fit the tiny model's 512: said, and fitted
    window = tmp_path / "W01-agent"
    assert re.search(r"window .*W01-agent", proc.stdout)
    for name in ("command.txt", "config.json", "machine.json", "raw.jsonl", "summary.json", "SUMMARY.md",
                 "aggregate.png", "ratios.png"):
        assert (window / name).is_file(), name
    raw = windows.read_raw(window)
    assert raw and all(r["error"] is None for r in raw), [r["error"] for r in raw if r["error"]][:3]
    assert {r["mode"] for r in raw} == set(modes.split(","))
    assert len(raw) == 2 * (7 * (1 + 2) + 3 * (1 + 2))  # reps x (one-turn modes x streams + turns x streams)
    assert all(r["prompt_tokens"] <= 512 - 8 for r in raw)
    # the longest wait between two streamed pieces lies within the reply's own time after its first
    assert all(r["gap_max_s"] is None or 0 <= r["gap_max_s"] <= r["t_last"] - r["t_first"] + 1e-9 for r in raw)
    assert any(r["gap_max_s"] for r in raw if r["mode"] == "greedy")
    convo = sorted((r["rep"], r["concurrency"], r["stream"], r["turn"], r["prompt_tokens"]) for r in raw
                   if r["mode"] == "conversation")
    assert all(b[4] > a[4] for a, b in zip(convo, convo[1:]) if a[:3] == b[:3])  # the history grows
    summary = json.loads((window / "summary.json").read_text())
    assert summary["errors"] == 0 and set(summary["pairs"]) == {"sampled/greedy", "defaults/greedy", "json/free",
                                                                "tools-auto/free", "tools-required/free",
                                                                "tools-required/tools-auto", "logprobs/free"}
    assert "| sampled/greedy | A |" in (window / "SUMMARY.md").read_text()
    assert "| longest gap p95 (ms) |" in (window / "SUMMARY.md").read_text()
    # the server's pb_cuda_graphs read around every pass: a CPU server captures none
    arms = list(json.loads((window / "config.json").read_text())["arms"])
    assert all(r["graphs_captured"] == 0 for r in raw)
    assert summary["graphs_captured"] == dict.fromkeys(arms, 0)
    assert ("CUDA graphs captured during the measured passes (each holds every stream for a step): "
            + ", ".join(f"{a} 0" for a in arms)) in (window / "SUMMARY.md").read_text()


@pytest.mark.engine
def test_a_replay_resends_one_prompt_and_finds_it_cached(server_on, tmp_path):
    """--modes replay: each stream sends its prompt --turns times, greedy; the sends after the
    first find its complete 256-token block in the prefix cache and reply the same."""
    proc = subprocess.run([sys.executable, "-m", "patchbay", "ab", "--url", server_on.url, "--model", server_on.model,
                           "--workload", "agent", "--modes", "replay", "--tasks", "edit", "--concurrency", "2", "--reps", "1",
                           "--warmup", "0", "--max-tokens", "8", "--turns", "3", "--prompt-tokens", "600",
                           "--results-dir", str(tmp_path), "--window", "replay"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    window = tmp_path / "W01-replay"
    sends = {}
    for r in windows.read_raw(window):
        assert r["error"] is None and r["mode"] == "replay" and r["prompt"].startswith("edit-"), r
        sends.setdefault(r["stream"], {})[r["turn"]] = r
    assert sorted(sends) == [0, 1] and all(sorted(s) == [0, 1, 2] for s in sends.values())
    assert json.loads((window / "config.json").read_text())["tasks"] == ["edit"]
    assert "; tasks edit" in (window / "SUMMARY.md").read_text()
    for s in sends.values():
        assert 256 < s[0]["prompt_tokens"] <= 512 - 8
        assert len({r["prompt_tokens"] for r in s.values()}) == 1 and len({r["text_sha256"] for r in s.values()}) == 1
        # every token but the two a resend computes again (0760 in the local set)
        assert [r["cached_tokens"] for r in s.values()] == [0] + [s[0]["prompt_tokens"] - 2] * 2
    assert sends[0][0]["prompt_tokens"] != sends[1][0]["prompt_tokens"] or \
        sends[0][0]["text_sha256"] != sends[1][0]["text_sha256"]  # two streams, two prompts
    text = (window / "SUMMARY.md").read_text()
    assert "Replay, arm A, send by send (medians):" in text and "| 2 | 2 |" in text

"""From the raw records of an agent-workload run to its summary, SUMMARY.md table and plots.

Per level, mode and arm: aggregate tok/s (a pass's completion tokens over its wall time, median
over reps), TTFT median and p95, per-stream decode tok/s (a request's tokens after the first over
its time after the first; median), reply and prompt lengths, cached prompt tokens, finish reasons.
Ratios are paired by rep (`stats.paired_ratio`: median over reps, bootstrap CI): mode against
mode within an arm (sampled/greedy, json/free, ...) and B against A within a mode.
"""

from __future__ import annotations

import json
from collections import Counter

import numpy as np

from . import agent, stats
from .windows import _ci, _num

FIGURES = ("aggregate", "decode", "ttft")


def _p95(values) -> float | None:
    values = [v for v in values if v is not None]
    return float(np.percentile(values, 95)) if values else None


def per_rep(records: list[dict]) -> dict:
    """figure -> {rep: value}: a pass's aggregate tok/s, its median per-stream decode and median TTFT."""
    reps: dict[int, list] = {}
    for r in records:
        reps.setdefault(r["rep"], []).append(r)
    out = {name: {} for name in FIGURES}
    for rep, recs in reps.items():
        wall = recs[0]["pass_wall_s"]
        out["aggregate"][rep] = sum(r["completion_tokens"] or 0 for r in recs) / wall if wall > 0 else None
        out["decode"][rep] = stats.median(stats.decode_tps(r) for r in recs)
        out["ttft"][rep] = stats.median(stats.ttft(r) for r in recs)
    return out


def figures(records: list[dict], failed: int) -> dict:
    """One cell of the table: a level, a mode, an arm (measured reps only, failed requests apart)."""
    reps = per_rep(records)
    return {"n": len(records), "failed": failed,
            "aggregate_tps": stats.median(reps["aggregate"].values()),
            "ttft_s": stats.median(stats.ttft(r) for r in records), "ttft_p95_s": _p95(stats.ttft(r) for r in records),
            "gap_p95_s": _p95(r.get("gap_max_s") for r in records),
            "decode_tps": stats.median(stats.decode_tps(r) for r in records),
            "decode_n": sum(1 for r in records if stats.decode_tps(r) is not None),
            "completion_tokens": stats.median(r["completion_tokens"] for r in records),
            "prompt_tokens": stats.median(r.get("prompt_tokens") for r in records),
            "cached_tokens": stats.median(r.get("cached_tokens") for r in records),
            "finish": dict(Counter(str(r.get("finish_reason")) for r in records))}


def ratio(num: list[dict], den: list[dict], seed: int) -> dict:
    """num/den paired by rep, for each figure."""
    a, b = per_rep(den), per_rep(num)
    return {name: stats.paired_ratio(a[name], b[name], seed + k) for k, name in enumerate(FIGURES)}


def summarize(records: list[dict], levels: list[int], modes: list[str], arms: list[str], seed: int) -> dict:
    measured = [r for r in records if not r.get("warmup")]
    good = [r for r in measured if not r.get("error")]
    out: dict = {"levels": {}, "pairs": [agent.pair_label(n, d) for n, d in agent.PAIRS if n in modes and d in modes]}
    for li, level in enumerate(levels):
        cell = {(m, a): [r for r in good if r["concurrency"] == level and r["mode"] == m and r["arm"] == a]
                for m in modes for a in arms}
        failed = Counter((r["mode"], r["arm"]) for r in measured if r["concurrency"] == level and r.get("error"))
        data = {"modes": {m: {a: figures(cell[m, a], failed[m, a]) for a in arms} for m in modes}, "ratios": {},
                "b_over_a": {}}
        for pi, (n, d) in enumerate(agent.PAIRS):
            if n in modes and d in modes:
                data["ratios"][agent.pair_label(n, d)] = {a: ratio(cell[n, a], cell[d, a], seed + 10_000 * li + 100 * pi)
                                              for a in arms}
        if len(arms) == 2:
            for mi, m in enumerate(modes):
                data["b_over_a"][m] = ratio(cell[m, arms[1]], cell[m, arms[0]], seed + 10_000 * li + 5_000 + 10 * mi)
        if "conversation" in modes:
            data["turns"] = {a: turns(cell["conversation", a]) for a in arms}
        if "replay" in modes:
            data["replays"] = {a: turns(cell["replay", a]) for a in arms}
        out["levels"][str(level)] = data
    out["graphs_captured"] = graphs_captured(measured, arms)
    out["errors"] = sum(1 for r in records if r.get("error"))
    out["requests"] = len(records)
    out["resamples"] = stats.RESAMPLES
    out["headline"] = headline(out, arms)
    return out


def graphs_captured(measured: list[dict], arms: list[str]) -> dict:
    """Per arm, the CUDA graphs its server captured during the measured passes (None where the
    server does not report them). Each capture held every stream of its pass for a step."""
    passes = {(r["arm"], r["rep"], r["concurrency"], r["mode"]): r.get("graphs_captured") for r in measured}
    out = {}
    for arm in arms:
        counts = [n for (a, *_), n in passes.items() if a == arm]
        out[arm] = None if not counts or None in counts else sum(counts)
    return out


def turns(records: list[dict]) -> list[dict]:
    """A conversation's figures turn by turn (what resending a growing history costs), or a
    replay's send by send (what resending the same prompt costs)."""
    by_turn: dict[int, list] = {}
    for r in records:
        by_turn.setdefault(r["turn"], []).append(r)
    return [{"turn": t + 1, "n": len(rs), "prompt_tokens": stats.median(r.get("prompt_tokens") for r in rs),
             "cached_tokens": stats.median(r.get("cached_tokens") for r in rs),
             "ttft_s": stats.median(stats.ttft(r) for r in rs), "decode_tps": stats.median(stats.decode_tps(r) for r in rs)}
            for t, rs in sorted(by_turn.items())]


def _x(r: dict | None) -> str:
    return "×?" if not r or r.get("ratio") is None else f"×{r['ratio']:.3f}"


def headline(summary: dict, arms: list[str]) -> str:
    """One line for the index: the highest level's aggregate and mode ratios (arm A), B/A per mode."""
    if not summary["levels"]:
        return "no data"
    level = max(summary["levels"], key=int)
    data = summary["levels"][level]
    first = next(iter(data["modes"]))
    agg = data["modes"][first][arms[0]]["aggregate_tps"]
    parts = [f"agent C{level}: {first} {_num(agg)} tok/s"]
    parts += [f"{pair} {_x(r[arms[0]]['aggregate'])}" for pair, r in data["ratios"].items()]
    if data["b_over_a"]:
        parts.append("B/A " + ", ".join(f"{m} {_x(r['aggregate'])}" for m, r in data["b_over_a"].items()))
    return "; ".join(parts) + f"; {summary['errors']} of {summary['requests']} failed"


# ---- Markdown ---------------------------------------------------------------------------------


def _ms(seconds) -> str:
    return _num(None if seconds is None else seconds * 1000, "{:.0f}")


def _ratio_cells(r: dict) -> str:
    return " | ".join(f"{_num(r[f]['ratio'], '{:.3f}')} {_ci(r[f]['ci95'])}" for f in FIGURES)


def level_tables(level: str, data: dict, arms: list[str]) -> list[str]:
    lines = [f"## Concurrency {level}", "",
             "| mode | arm | aggregate tok/s | decode tok/s per stream | TTFT median / p95 (ms) | longest gap p95 (ms) "
             "| reply tokens | prompt tokens | cached | finish | failed |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for mode, by_arm in data["modes"].items():
        for arm in arms:
            c = by_arm[arm]
            finish = ", ".join(f"{k} {v}" for k, v in sorted(c["finish"].items()))
            lines.append(f"| {mode} | {arm} | {_num(c['aggregate_tps'])} | {_num(c['decode_tps'])} | "
                         f"{_ms(c['ttft_s'])} / {_ms(c['ttft_p95_s'])} | {_ms(c.get('gap_p95_s'))} | "
                         f"{_num(c['completion_tokens'], '{:.0f}')} | "
                         f"{_num(c['prompt_tokens'], '{:.0f}')} | {_num(c['cached_tokens'], '{:.0f}')} | {finish} | "
                         f"{c['failed']} |")
    lines.append("")
    if data["ratios"]:
        lines += ["| ratio | arm | aggregate [95 % CI] | decode per stream [95 % CI] | TTFT [95 % CI] |",
                  "|---|---|---|---|---|"]
        for pair, by_arm in data["ratios"].items():
            lines += [f"| {pair} | {arm} | {_ratio_cells(by_arm[arm])} |" for arm in arms]
        lines.append("")
    if data["b_over_a"]:
        lines += ["| mode | B/A aggregate [95 % CI] | B/A decode per stream [95 % CI] | B/A TTFT [95 % CI] |",
                  "|---|---|---|---|"]
        lines += [f"| {mode} | {_ratio_cells(r)} |" for mode, r in data["b_over_a"].items()] + [""]
    for key, title, unit in (("turns", "Conversation", "turn"), ("replays", "Replay", "send")):
        for arm, rows in (data.get(key) or {}).items():
            lines += [f"{title}, arm {arm}, {unit} by {unit} (medians):", "",
                      f"| {unit} | n | prompt tokens | cached | TTFT (ms) | decode tok/s |",
                      "|---:|---:|---:|---:|---:|---:|"]
            lines += [f"| {t['turn']} | {t['n']} | {_num(t['prompt_tokens'], '{:.0f}')} | "
                      f"{_num(t['cached_tokens'], '{:.0f}')} | {_ms(t['ttft_s'])} | {_num(t['decode_tps'])} |"
                      for t in rows] + [""]
    return lines


def render_summary(name: str, command: str, config: dict, summary: dict, mach: dict | None = None) -> str:
    mach = mach or {}
    arms = list(config["arms"])
    fit = config["fitted"]
    lines = [f"# {name}", "", summary["headline"], "",
             f"- command: `{command}`",
             f"- server: {config['url']}, model `{config['model']}`, build `{config['build']}`"
             + (f"; arm B's server {config['b_server']['url']}, build `{config['b_server']['build']}`"
                if config.get("b_server") else ""),
             "- arms: " + ", ".join(f"{a} `pb_knobs` = `{json.dumps(k)}`" for a, k in config["arms"].items()),
             f"- workload: agent; modes {', '.join(config['modes'])}"
             + "".join(f"; **{m} skipped**: {why}" for m, why in config["skipped"].items())
             + (f"; tasks {', '.join(config['tasks'])}" if config.get("tasks") else ""),
             f"- prompts: {fit['text_tokens']} tokens each (context {config['context'] or 'not reported'}"
             + (f"; the tools modes' {fit['tools']} tools add {fit['tools_tokens']}" if fit["tools_tokens"] else "") + f"), {config['requests_per_stream']} "
             f"per stream and pass; conversation: {config['turns']} turns from {fit['first_turn_tokens']} tokens, "
             f"{fit['turn_tokens']} new a turn; replies up to {config['max_tokens']} tokens",
             *[f"- fitted: {note}" for note in fit["notes"]],
             f"- concurrency {', '.join(map(str, config['levels']))}; {config['reps']} reps after {config['warmup']} "
             "warmup rep(s); modes rotate one place a rep, the arm sent first alternates (`first` in raw.jsonl)",
             f"- requests: {summary['requests']} ({summary['errors']} failed)"
             + ("" if summary.get("complete", True) else "; **stopped early by the time limit**"),
             *[f"- CUDA graphs captured during the measured passes (each holds every stream for a step): "
               + ", ".join(f"{a} {'not reported' if n is None else n}" for a, n in captured.items())
               for captured in [summary.get("graphs_captured")] if captured],
             f"- created {config['created']}"
             + (f"; client machine {mach.get('hostname')} ({mach.get('cpus')} CPUs"
                + (f", {', '.join(mach['gpu'])}" if mach.get("gpu") else "") + f", Python {mach.get('python')})"
                if mach else ""),
             "",
             "Texts: Python standard-library sources of the client's Python and the language reference's prose, "
             "under an agent instruction (explain, edit, review, tests, summarize); every request opens with a "
             "system line of its own, so no prompt is another's and none is cached, except a conversation's "
             "earlier turns and a replay's earlier sends. The same texts and seeds go to every mode and arm. `sampled`: temperature 0.7, "
             "top_p 0.95, a seed per request; `defaults`: no sampling field (the model's generation defaults); "
             f"json, tools-* and logprobs sample as `sampled`, their free partner (the X/free ratios). "
             "Decode tok/s per stream: a request's tokens after the first over its time after the first "
             "(median over requests; a reply read in one burst is left out). Longest gap: a request's longest "
             "wait between two streamed pieces of its reply, p95 over requests (a stream stalled behind "
             "others' prefill shows here). Ratios: median of per-rep paired "
             f"ratios, percentile bootstrap CI over reps ({summary['resamples']} resamples, seed {config['seed']}).",
             ""]
    for level, data in summary["levels"].items():
        lines += level_tables(level, data, arms)
    lines += ["![aggregate tok/s by mode](aggregate.png)", "", "![mode ratios](ratios.png)", ""]
    return "\n".join(lines)


def write_finish(window, summary: dict, config: dict) -> None:
    from . import plots, windows

    config = json.loads((window / "config.json").read_text())
    windows.write_summary(window, summary, lambda name, command, mach: render_summary(name, command, config,
                                                                                      summary, mach))
    plots.agent_aggregate_plot(summary, config, window / "aggregate.png")
    plots.agent_ratio_plot(summary, config, window / "ratios.png")

"""What a soak's records mean: each request classified, the counts by kind, latency over time,
the RSS growth rule, the checks that set the exit status, and the report (console and window).

A request is classified by its own record alone (its kind's accepted status classes travel in
it), so a report can be recomputed from raw.jsonl.
"""

from __future__ import annotations

import json

import numpy as np

# The right answers: a good request served (or closed by the client on purpose), a bad one refused.
EXPECTED = ("ok", "disconnected", "expected_4xx")
# Everything else, in the order the report lists it.
UNEXPECTED = {"5xx": "5xx", "4xx_for_good": "4xx for a good request", "2xx_for_bad": "2xx for a bad request",
              "connection": "connection error", "timeout": "timeout", "stream_error": "error in the stream",
              "bad_body": "unreadable body", "other_status": "other status"}


def classify(rec: dict) -> str:
    """One of EXPECTED or a key of UNEXPECTED."""
    outcome, status = rec.get("outcome"), rec.get("status")
    if outcome in ("timeout", "connection"):
        return outcome
    if outcome == "closed" and (status is None or 200 <= status < 300):
        return "disconnected"
    if status is None:
        return "connection"
    if status >= 500:
        return "5xx"
    cls = f"{status // 100}xx"
    if outcome in ("stream_error", "bad_body") and cls == "2xx":
        return outcome
    if rec.get("bad"):
        if cls in rec.get("accept", ("4xx",)):
            return "expected_4xx" if cls == "4xx" else "ok"
        return "2xx_for_bad" if cls == "2xx" else "other_status"
    if cls == "4xx":
        return "4xx_for_good"
    return "ok" if cls == "2xx" else "other_status"


def unexpected(records: list[dict]) -> list[dict]:
    return [r for r in records if classify(r) not in EXPECTED]


def percentile(values, q: float) -> float | None:
    return float(np.percentile(values, q)) if len(values) else None


def latency_group(kind: str) -> str:
    """Latency is read per good kind; the bad cases are all one group (each is one quick refusal)."""
    return "bad" if kind.startswith("bad_") else kind


def by_kind(records: list[dict]) -> dict:
    out: dict = {}
    for rec in records:
        row = out.setdefault(rec["kind"], {"requests": 0, "bad": rec.get("bad", False), "categories": {},
                                            "not_openai_shape": 0, "statuses": {}})
        row["requests"] += 1
        cat = classify(rec)
        row["categories"][cat] = row["categories"].get(cat, 0) + 1
        if rec.get("status") is not None:
            row["statuses"][str(rec["status"])] = row["statuses"].get(str(rec["status"]), 0) + 1
        if rec.get("status") and 400 <= rec["status"] < 500 and rec.get("openai_shape") is False:
            row["not_openai_shape"] += 1
    for kind, row in out.items():
        lat = [r["latency_s"] for r in records if r["kind"] == kind and classify(r) in EXPECTED and r["latency_s"]]
        row["p50_s"], row["p95_s"] = percentile(lat, 50), percentile(lat, 95)
    return dict(sorted(out.items(), key=lambda kv: (kv[1]["bad"], kv[0])))


def bucket_size(duration_s: float, given: float | None = None) -> float:
    """The latency buckets' width: given, else a minute, narrower for a run under ten minutes."""
    return given or min(60.0, max(5.0, round(duration_s / 10)))


def latency_buckets(records: list[dict], bucket_s: float) -> list[dict]:
    """p50/p95 of the answered requests per latency group and bucket of start time."""
    groups: dict = {}
    for rec in records:
        if classify(rec) in EXPECTED and rec.get("latency_s") is not None:
            key = (latency_group(rec["kind"]), int(rec["t_start"] // bucket_s))
            groups.setdefault(key, []).append(rec["latency_s"])
    return [{"group": g, "t0_s": b * bucket_s, "n": len(v), "p50_s": percentile(v, 50), "p95_s": percentile(v, 95)}
            for (g, b), v in sorted(groups.items())]


def server_buckets(samples: list[dict], bucket_s: float) -> list[dict]:
    """The server's RSS (median, MiB) and the most requests it reported running, per bucket."""
    groups: dict = {}
    for smp in samples:
        groups.setdefault(int(smp["t"] // bucket_s), []).append(smp)
    out = []
    for b, group in sorted(groups.items()):
        rss = [x["rss_kib"] for x in group if x.get("rss_kib")]
        running = [x["running"] for x in group if x.get("running") is not None]
        out.append({"t0_s": b * bucket_s, "rss_mib": float(np.median(rss)) / 1024 if rss else None,
                    "running_max": max(running) if running else None})
    return out


def rss_growth(samples: list[dict], window_s: float = 60.0, min_samples: int = 3) -> dict:
    """The median RSS over the first `window_s` of the samples against the median over the last,
    each window at most a third of the span so they never overlap. `judged` is False (with
    `reason`) when there are too few samples to say."""
    pts = [(s["t"], s["rss_kib"]) for s in samples if s.get("rss_kib")]
    out = {"window_s": None, "first_kib": None, "last_kib": None, "growth": None, "judged": False, "reason": None}
    if len(pts) < 2 * min_samples:
        out["reason"] = f"{len(pts)} RSS sample(s); at least {2 * min_samples} are needed"
        return out
    t0, t1 = pts[0][0], pts[-1][0]
    w = min(window_s, (t1 - t0) / 3)
    first = [v for t, v in pts if t <= t0 + w]
    last = [v for t, v in pts if t >= t1 - w]
    out["window_s"] = w
    if len(first) < min_samples or len(last) < min_samples:
        out["reason"] = f"fewer than {min_samples} samples in a {w:.0f} s window; sample more often or run longer"
        return out
    out["first_kib"], out["last_kib"] = float(np.median(first)), float(np.median(last))
    out["growth"] = out["last_kib"] / out["first_kib"] - 1
    out["judged"] = True
    return out


def checks(records: list[dict], run: dict, growth: dict, limits: dict) -> list[dict]:
    """The checks that set the exit status, each {name, ok, detail}; `run` holds running_after,
    running_source, left_after (soak.left_behind_from), server_alive and pid; `limits`
    max_unexpected, max_leaked (slots, and what requests left behind), max_rss_growth."""
    bad = unexpected(records)
    counts: dict = {}
    for rec in bad:
        counts[classify(rec)] = counts.get(classify(rec), 0) + 1
    detail = ", ".join(f"{n} {UNEXPECTED[c]}" for c, n in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"
    out = [{"name": "unexpected answers", "ok": len(bad) <= limits["max_unexpected"],
            "detail": f"{len(bad)} of {len(records)} ({detail}); allowed {limits['max_unexpected']}"}]
    if run.get("running_after") is None:
        out.append({"name": "leaked slots", "ok": True, "detail": "not reported (the server has neither "
                    "/metrics pb_requests_running nor /health requests.running)"})
    else:
        out.append({"name": "leaked slots", "ok": run["running_after"] <= limits["max_leaked"],
                    "detail": f"{run['running_after']} request(s) still running {run.get('grace_waited_s', 0):.0f} s "
                              f"after the run (from {run['running_source']}); allowed {limits['max_leaked']}"})
    if growth["judged"]:
        out.append({"name": "RSS growth", "ok": growth["growth"] <= limits["max_rss_growth"],
                    "detail": f"{growth['growth'] * 100:+.1f} % ({growth['first_kib'] / 1024:.0f} -> "
                              f"{growth['last_kib'] / 1024:.0f} MiB, medians of the first and last "
                              f"{growth['window_s']:.0f} s); allowed {limits['max_rss_growth'] * 100:g} %"})
    else:
        why = growth["reason"] if run.get("pid") else "not sampled (give --run-dir or --pid)"
        out.append({"name": "RSS growth", "ok": True, "detail": f"not judged: {why}"})
    left = run.get("left_after")
    if left is None:
        out.append({"name": "left behind", "ok": True, "detail": "not reported (no pb_outputs_unclaimed or "
                    "pb_output_handlers in /metrics)"})
    else:
        out.append({"name": "left behind", "ok": sum(left.values()) <= limits["max_leaked"],
                    "detail": ", ".join(f"{name} {value}" for name, value in sorted(left.items()))
                    + f" after the run; allowed {limits['max_leaked']} in all"})
    if run.get("server_alive") is False:
        out.append({"name": "server alive", "ok": False, "detail": f"pid {run['pid']} exited during the soak"})
    return out


def summarize(records: list[dict], run: dict, limits: dict, bucket_s: float | None = None,
              rss_window_s: float = 60.0) -> dict:
    growth = rss_growth(run.get("samples", []), rss_window_s)
    found = checks(records, run, growth, limits)
    b = bucket_size(run.get("duration_s", 0), bucket_s)
    summary = {"requests": len(records), "unexpected": len(unexpected(records)), "kinds": by_kind(records),
               "latency": {"bucket_s": b, "buckets": latency_buckets(records, b),
                           "server": server_buckets(run.get("samples", []), b)},
               "rss": {"pid": run.get("pid"), **growth}, "running": {"source": run.get("running_source"),
                                                                    "after_grace": run.get("running_after"),
                                                                    "left_after": run.get("left_after")},
               "checks": found, "ok": all(c["ok"] for c in found), "limits": limits,
               "examples": examples(records)}
    summary["headline"] = headline(summary, run)
    return summary


def examples(records: list[dict], limit: int = 12) -> list[dict]:
    """The first unexpected answer of each (kind, class, status): what to look for in the server log."""
    seen, out = set(), []
    for rec in unexpected(records):
        key = (rec["kind"], classify(rec), rec.get("status"))
        if key not in seen and len(out) < limit:
            seen.add(key)
            out.append({"kind": rec["kind"], "class": classify(rec), "status": rec.get("status"),
                        "t_start": round(rec["t_start"], 2), "error": rec.get("error")})
    return out


def headline(summary: dict, run: dict) -> str:
    failed = [c["name"] for c in summary["checks"] if not c["ok"]]
    slots = summary["running"]["after_grace"]
    growth = summary["rss"]["growth"]
    return (f"soak {run.get('clients', '?')} clients {run.get('duration_s', 0):.0f} s: {summary['requests']} requests, "
            f"{summary['unexpected']} unexpected; slots after: {'not reported' if slots is None else slots}; "
            f"RSS {'not judged' if growth is None else f'{growth * 100:+.1f} %'}: "
            + ("PASS" if not failed else "FAIL (" + ", ".join(failed) + ")"))


# ---- the report ----------------------------------------------------------------------------------


def _ms(value) -> str:
    return "–" if value is None else f"{value * 1000:.0f}"


def kind_table(summary: dict) -> list[str]:
    cols = [c for c in UNEXPECTED if any(c in r["categories"] for r in summary["kinds"].values())]
    lines = ["| kind | requests | ok | disconnected | expected 4xx | " + " | ".join(UNEXPECTED[c] for c in cols)
             + (" | " if cols else "") + "statuses | p50 ms | p95 ms |",
             "|---|" + "---:|" * (4 + len(cols)) + "---|---:|---:|"]
    for kind, row in summary["kinds"].items():
        cats = row["categories"]
        statuses = ", ".join(f"{s}×{n}" for s, n in sorted(row["statuses"].items()))
        if row["not_openai_shape"]:
            statuses += f" ({row['not_openai_shape']} 4xx not in the OpenAI error shape)"
        lines.append(f"| {kind} | {row['requests']} | {cats.get('ok', 0)} | {cats.get('disconnected', 0)} | "
                     f"{cats.get('expected_4xx', 0)} | " + " | ".join(
                         (f"**{cats[c]}**" if cats.get(c) else "0") for c in cols) + (" | " if cols else "")
                     + f"{statuses or '–'} | {_ms(row['p50_s'])} | {_ms(row['p95_s'])} |")
    return lines


def render_console(summary: dict) -> str:
    lines = kind_table(summary) + [""]
    lines += [f"{'ok  ' if c['ok'] else 'FAIL'}  {c['name']}: {c['detail']}" for c in summary["checks"]]
    for ex in summary["examples"]:
        lines.append(f"  e.g. {ex['kind']} at {ex['t_start']:.1f}s: {UNEXPECTED[ex['class']]}"
                     + (f" (HTTP {ex['status']})" if ex["status"] else "") + f": {_one_line(ex['error'])}")
    return "\n".join(lines)


def _one_line(text) -> str:
    return " ".join(str(text or "").split())[:160]


def _cell(text) -> str:
    return _one_line(text).replace("|", "\\|")


def render_summary(name: str, command: str, config: dict, summary: dict, mach: dict | None = None) -> str:
    mach = mach or {}
    mix = ", ".join(f"{k} {v:g}" for k, v in config["mix"].items())
    lines = [f"# {name}", "", summary["headline"], "",
             f"- command: `{command}`",
             f"- server: {config['url']}, model `{config['model']}`, build `{config['build']}`, pid "
             f"{config.get('pid') or 'not known'}",
             f"- {config['clients']} clients for {config['duration_s']:g} s, each sending one request after another; "
             f"mix (weights by family): {mix}; bad cases: {', '.join(config['bad']) or 'none'}",
             f"- bounds: max_tokens {config['max_tokens']} (disconnecting kinds 4×), {config['timeout_s']:g} s a "
             f"request; disconnects close a stream after {config['disconnect_after']} chunk(s) or give up a whole "
             f"request after {config['disconnect_timeout_s']:g} s",
             f"- created {config['created']}" + (f"; client machine {mach.get('hostname')} ({mach.get('cpus')} CPUs)"
                                                  if mach else ""), "",
             "## Checks", ""]
    lines += [f"- {'ok' if c['ok'] else '**FAIL**'} {c['name']}: {c['detail']}" for c in summary["checks"]]
    lines += ["", "## Requests by kind", "",
              "A bad request (`bad_*`) is right when refused with a 4xx (`bad_missing_prompt` and "
              "`bad_empty_prompt` may also be served, as OpenAI serves a missing prompt, and "
              "`bad_huge_max_tokens` clamped to the context); a good one when served, or closed by the client "
              "on purpose (`disconnect_*`). Latency: milliseconds from sending to the last byte read, of the "
              "right answers.", ""]
    lines += kind_table(summary)
    if summary["examples"]:
        lines += ["", "## First unexpected answer of each kind", "", "| kind | class | status | at s | answer |",
                  "|---|---|---:|---:|---|"]
        lines += [f"| {e['kind']} | {UNEXPECTED[e['class']]} | {e['status'] or '–'} | {e['t_start']:.1f} | "
                  f"{_cell(e['error'])} |" for e in summary["examples"]]
    lines += ["", f"## Over time (buckets of {summary['latency']['bucket_s']:g} s)", ""] + time_table(summary)
    lines += ["", "![RSS and running requests](rss.png)", "", "![latency p50 and p95 by kind](latency.png)", ""]
    return "\n".join(lines)


def time_table(summary: dict) -> list[str]:
    """A row per bucket: the server's RSS and most running requests, each group's p50 / p95 (ms)."""
    lat = summary["latency"]
    groups = sorted({b["group"] for b in lat["buckets"]}, key=lambda g: (g == "bad", g))
    cells = {(b["group"], b["t0_s"]): f"{_ms(b['p50_s'])} / {_ms(b['p95_s'])}" for b in lat["buckets"]}
    server = {b["t0_s"]: b for b in lat.get("server", [])}
    starts = sorted(set(server) | {t for _, t in cells})
    lines = ["| from s | RSS MiB | running (max) | " + " | ".join(f"{g} p50 / p95 ms" for g in groups) + " |",
             "|---:|---:|---:|" + "---:|" * len(groups)]
    for t0 in starts:
        srv = server.get(t0, {})
        rss, running = srv.get("rss_mib"), srv.get("running_max")
        lines.append(f"| {t0:g} | {'–' if rss is None else f'{rss:.0f}'} | {'–' if running is None else running} | "
                     + " | ".join(cells.get((g, t0), "–") for g in groups) + " |")
    return lines


def write_window(window, summary: dict, samples: list[dict]) -> None:
    """summary.json, samples.json, SUMMARY.md and the two plots, after write_start and raw.jsonl."""
    from . import plots, windows

    (window / "samples.json").write_text(json.dumps(samples, indent=1) + "\n")
    config = json.loads((window / "config.json").read_text())
    windows.write_summary(window, summary, lambda name, command, mach: render_summary(
        name, command, config, summary, mach))
    plots.rss_plot(samples, summary, window / "rss.png")
    plots.latency_plot(summary, window / "latency.png")

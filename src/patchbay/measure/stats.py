"""From the raw records of an A/B run to its summary: per-request figures, paired ratios with
bootstrap confidence intervals, and whether the two arms gave the same replies.

Records are plain dicts (one line of raw.jsonl each); see `bench.run_request` for the fields.
"""

from __future__ import annotations

import math
import statistics

import numpy as np

RESAMPLES = 2000
# Tokens after the first that all arrived within this long were read in one burst (a starved
# client, or a server that buffered them): their rate says nothing about decoding, so it is left out.
BURST_S = 0.001


def decode_tps(rec: dict) -> float | None:
    """Tokens per second after the first token: (n - 1) / (t_last - t_first)."""
    n, first, last = rec.get("completion_tokens"), rec.get("t_first"), rec.get("t_last")
    if not n or n < 2 or first is None or last is None or last - first < BURST_S:
        return None
    return (n - 1) / (last - first)


def ttft(rec: dict) -> float | None:
    if rec.get("t_first") is None:
        return None
    return rec["t_first"] - rec["t_start"]


def prefill_tps(rec: dict) -> float | None:
    t = ttft(rec)
    return rec["prompt_tokens"] / t if t and rec.get("prompt_tokens") else None


def median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def bootstrap_ci(values, seed: int, resamples: int = RESAMPLES, level: float = 0.95) -> tuple[float, float] | None:
    """Percentile bootstrap CI of the median of `values` (resampled with replacement, seeded)."""
    data = np.asarray([v for v in values if v is not None], dtype=float)
    if data.size == 0:
        return None
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, data.size, size=(resamples, data.size))
    medians = np.median(data[picks], axis=1)
    tail = (1 - level) / 2 * 100
    lo, hi = np.percentile(medians, [tail, 100 - tail])
    return float(lo), float(hi)


def paired_ratio(a_by_rep: dict, b_by_rep: dict, seed: int) -> dict:
    """B/A per rep where both arms have a value, their median, and its bootstrap CI over reps;
    and `balanced`, the geometric mean of B/A over rounds (reps 2k and 2k + 1, one with A sent
    first and one with B), so a cost of going first cancels (W14: at C1 the first arm of a pass
    decoded about 4 % slower, in both arms; with 3 reps one arm went first twice)."""
    reps = sorted(set(a_by_rep) & set(b_by_rep))
    by_rep = {r: b_by_rep[r] / a_by_rep[r] for r in reps
              if a_by_rep[r] is not None and b_by_rep[r] is not None and a_by_rep[r] > 0}
    ratios = list(by_rep.values())
    rounds = [math.sqrt(by_rep[r] * by_rep[r + 1]) for r in by_rep if r % 2 == 0 and r + 1 in by_rep]
    return {"ratio": median(ratios), "ci95": bootstrap_ci(ratios, seed), "pairs": len(ratios),
            "balanced": statistics.geometric_mean(rounds) if rounds else None,
            "rounds": len(rounds)}


def reply_key(rec: dict) -> str | None:
    """What identifies a reply: the server's token fingerprint when it sent one, else the text hash."""
    return rec.get("fingerprint") or rec.get("text_sha256")


def compare_replies(a_records: list[dict], b_records: list[dict]) -> dict:
    """Whether every reply of both arms is the same (one fingerprint or text hash across all).

    Fingerprints and text hashes are not comparable with each other, so when only some records
    carry a fingerprint the text hashes are compared instead.
    """
    records = a_records + b_records
    use_fp = bool(records) and all(r.get("fingerprint") for r in records)
    key = (lambda r: r["fingerprint"]) if use_fp else (lambda r: r.get("text_sha256"))
    a = {key(r) for r in a_records}
    b = {key(r) for r in b_records}
    return {"equal": bool(a) and bool(b) and len(a | b) == 1, "by": "fingerprint" if use_fp else "text_sha256",
            "a_distinct": len(a), "b_distinct": len(b)}


def _per_rep(records: list[dict], figure) -> dict:
    """rep -> median of `figure` over that rep's records (a prompt may be sent several times)."""
    by_rep: dict[int, list] = {}
    for rec in records:
        by_rep.setdefault(rec["rep"], []).append(figure(rec))
    return {rep: median(vals) for rep, vals in by_rep.items()}


def summarize(records: list[dict], prompt_ids: list[str], levels: list[int], seed: int) -> dict:
    """Per concurrency level: per-prompt figures of each arm, B/A ratios with CIs, reply equality,
    and the aggregate throughput of each pass. Warmup records and failed requests are left out."""
    good = [r for r in records if not r.get("warmup") and not r.get("error")]
    out = {"levels": {}}
    for level in levels:
        at = [r for r in good if r["concurrency"] == level]
        prompts = {}
        for i, pid in enumerate(prompt_ids):
            arm = {name: [r for r in at if r["prompt"] == pid and r["arm"] == name] for name in "AB"}
            row = {}
            for name in "AB":
                row[name] = {"decode_tps": median(decode_tps(r) for r in arm[name]),
                             "decode_n": sum(1 for r in arm[name] if decode_tps(r) is not None),
                             "ttft_s": median(ttft(r) for r in arm[name]),
                             "prefill_tps": median(prefill_tps(r) for r in arm[name]),
                             "completion_tokens": median(r["completion_tokens"] for r in arm[name]),
                             "n": len(arm[name])}
            row["decode"] = paired_ratio(_per_rep(arm["A"], decode_tps), _per_rep(arm["B"], decode_tps),
                                         seed + 1000 * level + i)
            row["replies"] = compare_replies(arm["A"], arm["B"])
            prompts[pid] = row
        out["levels"][str(level)] = {"prompts": prompts, "aggregate": aggregate(at, seed + 1000 * level + 999)}
    # Across levels too: a request served next to others must reply as when served alone.
    out["replies_all_levels"] = {pid: compare_replies([r for r in good if r["prompt"] == pid and r["arm"] == "A"],
                                                      [r for r in good if r["prompt"] == pid and r["arm"] == "B"])
                                 for pid in prompt_ids}
    out["errors"] = sum(1 for r in records if r.get("error"))
    out["requests"] = len(records)
    return out


def aggregate(records: list[dict], seed: int) -> dict:
    """Aggregate tok/s of each pass (one arm, one rep, one level): its completion tokens over its
    wall time; the median per arm and the paired B/A ratio over reps."""
    passes: dict[tuple, dict] = {}
    for r in records:
        p = passes.setdefault((r["arm"], r["rep"]), {"tokens": 0, "wall": r["pass_wall_s"]})
        p["tokens"] += r["completion_tokens"] or 0
    tps = {arm: {rep: p["tokens"] / p["wall"] for (a, rep), p in passes.items() if a == arm and p["wall"] > 0}
           for arm in "AB"}
    return {"A_tps": median(tps["A"].values()), "B_tps": median(tps["B"].values()),
            **paired_ratio(tps["A"], tps["B"], seed)}


def headline(summary: dict) -> str:
    """One line for the index: throughput at the highest level and how many prompts replied the same."""
    if not summary.get("levels"):
        return "no data"
    level = max(summary["levels"], key=int)
    agg = summary["levels"][level]["aggregate"]
    rows = summary["levels"][level]["prompts"].values()
    same = sum(1 for row in rows if row["replies"]["equal"])
    if agg["A_tps"] is None or agg["B_tps"] is None:
        return f"C{level}: no throughput measured"
    ratio = f"×{agg['ratio']:.3f}" if agg["ratio"] is not None else "×?"
    return (f"C{level} aggregate {agg['A_tps']:.1f} → {agg['B_tps']:.1f} tok/s ({ratio}); "
            f"replies equal {same}/{len(rows)}")

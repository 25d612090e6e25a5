"""The plots of a results window, drawn off-screen (matplotlib's Agg backend) from its summary."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from PIL import Image  # noqa: E402  (matplotlib's own dependency)

COLORS = 64  # a plot's palette: its few line colours and their antialiased edges


def save(fig, out: Path) -> None:
    """The figure as a palette PNG of COLORS colours, without dithering, and closed: a quarter
    of the bytes of matplotlib's RGBA PNG for the same picture. The windows are committed, and
    every device call carries the tree (python -m patchbay.device wheels checks the room left)."""
    fig.canvas.draw()
    picture = Image.frombuffer("RGBA", fig.canvas.get_width_height(), fig.canvas.buffer_rgba()).convert("RGB")
    plt.close(fig)
    picture.quantize(colors=COLORS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        out, format="PNG", optimize=True)


def _title(config: dict) -> str:
    return f"A {json.dumps(config['arms']['A'])}  vs  B {json.dumps(config['arms']['B'])}"


def _ratio_bars(ax, levels: list, ratios: list) -> None:
    """One marker series per level: ratios[k][i] is {"ratio", "ci95"} of column i at levels[k]
    (a ratio of None is left out), its 95 % CI as error bars, and the line of no change."""
    width = 0.7 / max(len(levels), 1)
    for k, level in enumerate(levels):
        xs, ys, lo, hi = [], [], [], []
        for i, r in enumerate(ratios[k]):
            if r["ratio"] is None:
                continue
            ci = r["ci95"] or (r["ratio"], r["ratio"])
            xs.append(i - 0.35 + width * (k + 0.5))
            ys.append(r["ratio"])
            lo.append(max(r["ratio"] - ci[0], 0.0))
            hi.append(max(ci[1] - r["ratio"], 0.0))
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=f"C{level}")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")


def ratio_plot(summary: dict, config: dict, out: Path) -> None:
    """B/A decode tok/s per prompt, one marker series per concurrency level, 95 % CI as error bars."""
    levels = list(summary["levels"])
    prompts = list(summary["levels"][levels[0]]["prompts"]) if levels else []
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(prompts) + 2), 4.2), dpi=100)
    _ratio_bars(ax, levels, [[summary["levels"][lv]["prompts"][pid]["decode"] for pid in prompts] for lv in levels])
    ax.set_xticks(range(len(prompts)), prompts, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("decode tok/s, B / A")
    ax.set_title(_title(config), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out)


def aggregate_plot(summary: dict, config: dict, out: Path) -> None:
    """Aggregate tok/s (median over reps) against concurrency, one line per arm."""
    levels = sorted(summary["levels"], key=int)
    fig, ax = plt.subplots(figsize=(6.0, 4.2), dpi=100)
    for arm, style in (("A", "o-"), ("B", "s--")):
        pts = [(int(lv), summary["levels"][lv]["aggregate"][f"{arm}_tps"]) for lv in levels]
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax.plot([x for x, _ in pts], [y for _, y in pts], style, label=f"{arm} {json.dumps(config['arms'][arm])}")
    if levels and int(levels[-1]) / max(int(levels[0]), 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks([int(lv) for lv in levels], [str(lv) for lv in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("aggregate tok/s")
    ax.set_ylim(bottom=0)
    ax.set_title(_title(config), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out)


def rss_plot(samples: list[dict], summary: dict, out: Path) -> None:
    """A soak's server RSS (MiB) over time, and the requests the server reported running."""
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=100)
    rss = [(s["t"], s["rss_kib"] / 1024) for s in samples if s.get("rss_kib")]
    if rss:
        ax.plot([t for t, _ in rss], [v for _, v in rss], "-", color="tab:blue", label="RSS")
        growth = summary["rss"]
        if growth.get("judged"):
            for kib, label, x, ha in ((growth["first_kib"], "first window's median", rss[0][0], "left"),
                                      (growth["last_kib"], "last window's median", rss[-1][0], "right")):
                ax.axhline(kib / 1024, color="grey", linewidth=0.8, linestyle="--")
                ax.annotate(label, (x, kib / 1024), fontsize=7, color="grey", va="bottom", ha=ha)
        lo, hi = min(v for _, v in rss), max(v for _, v in rss)
        ax.set_ylim(lo * 0.97, hi * 1.03)  # a growth of a few per cent shows as such, not as a cliff
    else:
        ax.text(0.5, 0.5, "RSS not sampled (no server pid)", ha="center", transform=ax.transAxes)
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("server RSS, MiB")
    running = [(s["t"], s["running"]) for s in samples if s.get("running") is not None]
    if running:
        twin = ax.twinx()
        twin.step([t for t, _ in running], [v for _, v in running], where="post", color="tab:orange",
                  linewidth=0.8, label="running requests")
        twin.set_ylabel("running requests (server)")
        twin.set_ylim(bottom=0)
    ax.set_title(summary["headline"], fontsize=7)
    fig.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    save(fig, out)


def latency_plot(summary: dict, out: Path) -> None:
    """A soak's latency per request group over time: p50 solid, p95 dashed, one colour a group."""
    buckets = summary["latency"]["buckets"]
    width = summary["latency"]["bucket_s"]
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=100)
    groups = list(dict.fromkeys(b["group"] for b in buckets))
    for i, group in enumerate(groups):
        pts = [b for b in buckets if b["group"] == group]
        xs = [b["t0_s"] + width / 2 for b in pts]
        colour = f"C{i % 10}"
        ax.plot(xs, [b["p50_s"] * 1000 for b in pts], "o-", color=colour, markersize=3, label=f"{group} p50")
        ax.plot(xs, [b["p95_s"] * 1000 for b in pts], "--", color=colour, linewidth=0.8)
    if buckets:
        ax.set_yscale("log")
    ax.set_xlabel(f"seconds since the start (buckets of {width:g} s)")
    ax.set_ylabel("latency, ms (p50 solid, p95 dashed)")
    ax.set_title(summary["headline"], fontsize=7)
    if groups:
        ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save(fig, out)


def agent_aggregate_plot(summary: dict, config: dict, out: Path) -> None:
    """An agent run's aggregate tok/s against concurrency, a colour per mode (arm A solid, B dashed)."""
    levels = sorted(summary["levels"], key=int)
    fig, ax = plt.subplots(figsize=(7.0, 4.2), dpi=100)
    modes = list(summary["levels"][levels[0]]["modes"]) if levels else []
    for i, mode in enumerate(modes):
        for arm, style in zip(config["arms"], ("o-", "s--")):
            pts = [(int(lv), summary["levels"][lv]["modes"][mode][arm]["aggregate_tps"]) for lv in levels]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], style, color=f"C{i % 10}",
                        label=f"{mode}" + (f" {arm}" if len(config["arms"]) > 1 else ""))
    if levels and int(levels[-1]) / max(int(levels[0]), 1) >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks([int(lv) for lv in levels], [str(lv) for lv in levels])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate tok/s")
    ax.set_ylim(bottom=0)
    ax.set_title(summary["headline"], fontsize=7)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save(fig, out)


def agent_ratio_plot(summary: dict, config: dict, out: Path) -> None:
    """An agent run's paired ratios of aggregate tok/s (mode pairs per arm, and B/A per mode) with
    their 95 % CI, a marker series per concurrency level."""
    levels = list(summary["levels"])
    rows = []  # (label, level -> ratio dict)
    for pair in summary.get("pairs", []):
        for arm in config["arms"]:
            rows.append((f"{pair} {arm}" if len(config["arms"]) > 1 else pair,
                         {lv: summary["levels"][lv]["ratios"][pair][arm]["aggregate"] for lv in levels}))
    modes = list(summary["levels"][levels[0]]["b_over_a"]) if levels else []
    rows += [(f"B/A {m}", {lv: summary["levels"][lv]["b_over_a"][m]["aggregate"] for lv in levels}) for m in modes]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.6 * len(rows) + 2), 4.2), dpi=100)
    _ratio_bars(ax, levels, [[by_level[lv] for _, by_level in rows] for lv in levels])
    ax.set_xticks(range(len(rows)), [label for label, _ in rows], rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("aggregate tok/s, ratio")
    ax.set_title("paired ratios, median over reps, 95 % CI", fontsize=9)
    if levels:
        ax.legend(fontsize=8)
    fig.tight_layout()
    save(fig, out)

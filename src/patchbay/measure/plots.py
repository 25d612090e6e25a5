"""The plots of a results window, drawn off-screen (matplotlib's Agg backend) from its summary."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)


def _title(config: dict) -> str:
    return f"A {json.dumps(config['arms']['A'])}  vs  B {json.dumps(config['arms']['B'])}"


def ratio_plot(summary: dict, config: dict, out: Path) -> None:
    """B/A decode tok/s per prompt, one marker series per concurrency level, 95 % CI as error bars."""
    levels = list(summary["levels"])
    prompts = list(summary["levels"][levels[0]]["prompts"]) if levels else []
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(prompts) + 2), 4.2), dpi=100)
    width = 0.7 / max(len(levels), 1)
    for k, level in enumerate(levels):
        xs, ys, lo, hi = [], [], [], []
        for i, pid in enumerate(prompts):
            dec = summary["levels"][level]["prompts"][pid]["decode"]
            if dec["ratio"] is None:
                continue
            ci = dec["ci95"] or (dec["ratio"], dec["ratio"])
            xs.append(i - 0.35 + width * (k + 0.5))
            ys.append(dec["ratio"])
            lo.append(max(dec["ratio"] - ci[0], 0.0))
            hi.append(max(ci[1] - dec["ratio"], 0.0))
        ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", capsize=3, label=f"C{level}")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(prompts)), prompts, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("decode tok/s, B / A")
    ax.set_title(_title(config), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)


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
    fig.savefig(out)
    plt.close(fig)

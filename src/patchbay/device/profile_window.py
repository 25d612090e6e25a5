"""A results window from `python -m patchbay.device profile` runs brought back from the GPU machine:

    python -m patchbay.device profile window --slug S --title T --headline H --part NAME=DIR ... [--notes F]

each part's files in a subfolder, the tables of every pass (the decode step by category,
throughput next to the roofline, cold-prompt TTFT), then the notes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ..measure import windows
from .gpu_profile import STEP_HEADER, step_table_row


def window_tables(parts: list[tuple[str, dict]]) -> tuple[list[str], dict]:
    """Markdown tables of a window from the profile.json records of its parts: the decode step
    by category, throughput next to the roofline, and cold-prompt TTFT; and a summary."""
    steps, speed, ttft, summary = [], [], [], {"tok_s": {}, "ttft_s": {}}
    for part, record in parts:
        for row in record["passes"]:
            label = f"{part} / {row['setting']}"
            if "prefill_tokens" in row:
                ttft.append(f"| {label} | {row['prefill_tokens']} | "
                            + " / ".join(f"{t:.3f}" for t in row["ttft_all_s"]) + " |")
                summary["ttft_s"][label] = row["ttft_s"]
                if "profile" in row:
                    steps.append(step_table_row(f"{label}, cold {row['prefill_tokens']}-token prompt", row["profile"]))
            elif "aggregate_tok_s" in row:
                speed.append(f"| {label} | C{row['concurrency']} | {row['aggregate_tok_s']:.1f} | "
                             f"{row['per_stream_decode_tok_s'] or 0:.1f} | {row['roofline_tok_s']:.0f} | "
                             f"{row['of_roofline']:.3f} | {row['distinct_replies']} | `{row.get('replies_sha', '-')}` |")
                summary["tok_s"].setdefault(label, {})[str(row["concurrency"])] = row["aggregate_tok_s"]
                if "profile" in row:
                    steps.append(step_table_row(f"{label}, C{row['concurrency']}", row["profile"]))
            else:
                speed.append(f"| {label} | C{row.get('concurrency', '?')} | error: {row.get('error', '?')[:80]} "
                             "| | | | | |")
    lines = ["## Per decode step (ms; kernels summed by name from the profiler, wall = timed pass / steps)", "",
             "| part / setting, level | wall | GPU busy " + STEP_HEADER, "|---|" + "---:|" * 10, *steps, "",
             "`host gap` = wall − GPU busy: host work between steps that the GPU waits for. A cold-prompt "
             "row is one prompt's time to its first token, not a decode step.", "",
             "## Throughput (aggregate tok/s; roofline = HBM bandwidth over the bf16 bytes a step reads, "
             "`patchbay.measure.roofline`)", "",
             "| part / setting | level | aggregate tok/s | per-stream decode tok/s | roofline tok/s | of roofline | "
             "distinct replies | replies sha |", "|---|---|---:|---:|---:|---:|---:|---|", *speed, ""]
    if ttft:
        lines += ["## Cold prompt, time to the first token (s; each after a warm-up prompt)", "",
                  "| part / setting | prompt tokens | TTFT |", "|---|---:|---|", *ttft, ""]
    return lines, summary


def write_window(results_dir: Path, slug: str, title: str, parts: list[tuple[str, Path]], notes: str,
                 headline: str) -> Path:
    """A results window from gpu_profile runs: each part's files (profile.json, command) in a subfolder,
    the tables above, then the notes (what was found, in words)."""
    import shutil

    records = [(name, json.loads((folder / "profile.json").read_text())) for name, folder in parts]
    window = windows.create(results_dir, slug)
    commands = []
    for name, folder in parts:
        (window / name).mkdir()
        for item in folder.iterdir():  # the run's own files (profile.json, command.txt, logs)
            if item.is_file():
                shutil.copy(item, window / name / item.name)
        command = folder / "command.txt"
        commands.append(f"{name}: {command.read_text().strip() if command.is_file() else '(not recorded)'}")
    tables, summary = window_tables(records)
    first = records[0][1]
    intro = [f"# W{window.name[1:3]}: {title}", "",
             f"`python -m patchbay.device profile` on {first['device']} (torch {first['torch']}), model "
             f"`{first.get('model', 'synthetic:air12')}`; the settings of each part are in its profile.json.", ""]
    (window / "SUMMARY.md").write_text("\n".join(intro + tables + [notes.strip(), ""]))
    (window / "command.txt").write_text("\n".join(commands) + "\n")
    (window / "config.json").write_text(json.dumps({
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": first.get("model"),
        "device": first["device"], "torch": first["torch"],
        "parts": {name: {"settings": rec["settings"], "build": rec.get("build")} for name, rec in records}},
        indent=2) + "\n")
    (window / "summary.json").write_text(json.dumps({"headline": headline, **summary}, indent=2) + "\n")
    return window


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m patchbay.device profile window")
    p.add_argument("--slug", required=True)
    p.add_argument("--title", required=True)
    p.add_argument("--part", action="append", required=True, metavar="NAME=DIR",
                   help="a gpu_profile --out folder (repeatable, in order)")
    p.add_argument("--notes", help="a Markdown file of findings, appended")
    p.add_argument("--headline", required=True)
    p.add_argument("--results-dir", default=None)
    args = p.parse_args(argv)

    parts = []
    for spec in args.part:
        name, sep, folder = spec.partition("=")
        if not sep or not (Path(folder) / "profile.json").is_file():
            raise SystemExit(f"--part {spec}: expected NAME=DIR with DIR/profile.json")
        parts.append((name, Path(folder)))
    notes = Path(args.notes).read_text() if args.notes else ""
    results_dir = Path(args.results_dir) if args.results_dir else windows.RESULTS_DIR
    try:
        window = write_window(results_dir, args.slug, args.title, parts, notes, args.headline)
    except windows.WindowError as e:
        raise SystemExit(str(e)) from None
    print(f"window {window}")
    return 0

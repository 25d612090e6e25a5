"""Results windows: one folder per measurement, `results/WNN-slug/`, and their index docs/RESULTS.md.

A window holds what is needed to trust or redo a measurement: the exact command, the run's
settings and the server's build, the machine, every request's raw record, the summary (JSON for
tools, Markdown for people) and plots. Windows are numbered in creation order and never
overwritten; the index is generated from them, so it is always rebuilt, never edited.
"""

from __future__ import annotations

import gzip
import json
import os
import platform
import re
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from .. import ROOT, __version__

RESULTS_DIR = ROOT / "results"
INDEX = ROOT / "docs" / "RESULTS.md"
_NAME = re.compile(r"^W(\d{2,})-([a-z0-9][a-z0-9-]*)$")


class WindowError(ValueError):
    pass


def check_slug(slug: str) -> str:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,47}", slug):
        raise WindowError(f"--window {slug!r}: use lowercase letters, digits and dashes "
                          "(at most 48, e.g. sse-done-c8)")
    return slug


def existing(results_dir: Path) -> list[tuple[int, str, Path]]:
    """(number, slug, path) of every window folder, in number order."""
    if not results_dir.is_dir():
        return []
    found = []
    for path in results_dir.iterdir():
        m = _NAME.match(path.name)
        if m and path.is_dir():
            found.append((int(m.group(1)), m.group(2), path))
    return sorted(found)


def create(results_dir: Path, slug: str) -> Path:
    """A new, empty window folder numbered one past the highest existing; never an existing one."""
    check_slug(slug)
    results_dir.mkdir(parents=True, exist_ok=True)
    number = max((n for n, _, _ in existing(results_dir)), default=0) + 1
    while True:
        path = results_dir / f"W{number:02d}-{slug}"
        try:
            path.mkdir()  # fails if it exists: another run took the number first
            return path
        except FileExistsError:
            number += 1


def machine() -> dict:
    """The machine that ran the benchmark client (for a local server, also the server's)."""
    info = {"hostname": socket.gethostname(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "memory_gib": None, "torch": None, "gpu": None}
    try:
        kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                   if line.startswith("MemTotal:"))
        info["memory_gib"] = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:
        pass
    return info


def repo_state() -> dict:
    """The patchbay checkout the run came from: commit and whether it had local changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return {"commit": None, "dirty": None}
    return {"commit": head.stdout.strip() or None,
            "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}


def write_start(window: Path, command: str, config: dict) -> None:
    (window / "command.txt").write_text(command + "\n")
    config = {**config, "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
              "patchbay": __version__, "repo": repo_state()}
    (window / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (window / "machine.json").write_text(json.dumps(machine(), indent=2) + "\n")


def append_raw(window: Path, records: list[dict]) -> None:
    with (window / "raw.jsonl").open("a") as f:
        for rec in records:
            f.write(json.dumps(rec, sort_keys=True) + "\n")


def read_text(path: Path) -> str:
    """A window file's text: `path`, or `path`.gz where a committed window keeps a large one
    compressed (so the tree stays small enough to carry to the device); OSError with neither."""
    packed = path.with_name(path.name + ".gz")
    if not path.is_file() and packed.is_file():
        return gzip.decompress(packed.read_bytes()).decode()
    return path.read_text()


def read_raw(window: Path) -> list[dict]:
    """A window's records: raw.jsonl (or raw.jsonl.gz, read_text); [] where it has neither."""
    try:
        text = read_text(window / "raw.jsonl")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_summary(window: Path, summary: dict, render) -> None:
    """summary.json, and SUMMARY.md from `render(name, command, machine)`, into a window that
    write_start began (the summary's `headline` is the index's)."""
    (window / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    command = (window / "command.txt").read_text().strip()
    mach = json.loads((window / "machine.json").read_text())
    (window / "SUMMARY.md").write_text(render(window.name, command, mach))


def write_finish(window: Path, summary: dict) -> None:
    from . import plots

    config = json.loads((window / "config.json").read_text())
    write_summary(window, summary, lambda name, command, mach: render_summary(name, command, config, summary, mach))
    plots.ratio_plot(summary, config, window / "ratio.png")
    plots.aggregate_plot(summary, config, window / "aggregate.png")


# ---- Markdown --------------------------------------------------------------------------------


def _num(value, fmt: str = "{:.1f}") -> str:
    return "–" if value is None else fmt.format(value)


def _ci(ci) -> str:
    return "–" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell: pipes escaped, lines joined."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip()).replace("|", "\\|")


def level_table(level: str, data: dict) -> list[str]:
    agg = data["aggregate"]
    lines = [f"## Concurrency {level}", "",
             f"Aggregate: A {_num(agg['A_tps'])} tok/s, B {_num(agg['B_tps'])} tok/s, "
             f"B/A {_num(agg['ratio'], '{:.3f}')} {_ci(agg['ci95'])} ({agg['pairs']} paired passes)"
             + (f"; order-balanced B/A {agg['balanced']:.3f} over {agg['rounds']} round(s) of an A-first and a "
                "B-first pass." if agg.get("rounds") else "."), "",
             "| prompt | A decode tok/s | B decode tok/s | B/A | 95 % CI | TTFT A / B (ms) "
             "| prefill tok/s A / B | hashes equal |",
             "|---|---:|---:|---:|---|---:|---:|---|"]
    for pid, row in data["prompts"].items():
        a, b, rep = row["A"], row["B"], row["replies"]
        same = "yes" if rep["equal"] else f"**no** (A {rep['a_distinct']}, B {rep['b_distinct']} distinct)"
        ttft = " / ".join(_num(None if x["ttft_s"] is None else x["ttft_s"] * 1000, "{:.0f}") for x in (a, b))
        lines.append(f"| {pid} | {_num(a['decode_tps'])} | {_num(b['decode_tps'])} | "
                     f"{_num(row['decode']['ratio'], '{:.3f}')} | {_ci(row['decode']['ci95'])} | {ttft} | "
                     f"{_num(a['prefill_tps'], '{:.0f}')} / {_num(b['prefill_tps'], '{:.0f}')} | {same} |")
    return lines + [""]


def render_summary(name: str, command: str, config: dict, summary: dict, mach: dict | None = None) -> str:
    mach = mach or {}
    arms = config["arms"]
    lines = [f"# {name}", "",
             f"{summary['headline']}", "",
             f"- command: `{command}`",
             f"- server: {config['url']}, model `{config['model']}`, build `{config['build']}`",
             f"- arms: A `pb_knobs` = `{json.dumps(arms['A'])}`, B `pb_knobs` = `{json.dumps(arms['B'])}`",
             f"- prompts: {len(config['prompts'])} from suites {', '.join(config['suites'])}; max tokens "
             f"{config['max_tokens'] or 'per prompt'}; greedy, streamed"
             + ("; cold: each request starts with a line of its own, so nothing of its prompt was cached"
                if config.get("cold") else "")
             + ("; distinct copies: a prompt's copies 2, 3, ... open with 'Copy N.', so no two requests of a "
                "level are alike" if config.get("distinct_copies") else ""),
             f"- concurrency {', '.join(map(str, config['levels']))}; {config['reps']} reps after "
             f"{config['warmup']} warmup rep(s) (discarded); the arm sent first alternates every rep "
             "(`first` in raw.jsonl)",
             f"- requests: {summary['requests']} ({summary['errors']} failed)"
             + ("" if summary.get("complete", True) else "; **stopped early by the time limit**"),
             f"- created {config['created']}"
             + (f"; client machine {mach.get('hostname')} ({mach.get('cpus')} CPUs"
                + (f", {', '.join(mach['gpu'])}" if mach.get("gpu") else "") + ")" if mach else ""),
             "",
             "Decode tok/s counts the tokens after the first over the time after the first token "
             f"(median; a reply whose later tokens all arrived within {summary.get('burst_s', 0.001) * 1000:g} ms "
             "was read in one burst and is left out). B/A is the median of the per-rep paired ratios "
             "(so not always the ratio of the two medians); the 95 % CI is a "
             f"percentile bootstrap over reps ({summary['resamples']} resamples, seed {config['seed']}). "
             "Hashes equal: every reply of both arms has the same "
             "token fingerprint (or text hash, when the server sends no fingerprint).", ""]
    for level, data in summary["levels"].items():
        lines += level_table(level, data)
    across = summary.get("replies_all_levels") or {}
    if len(summary["levels"]) > 1 and across:
        differ = [pid for pid, c in across.items() if not c["equal"]]
        lines += [f"Across all levels, every reply of both arms was the same for {len(across) - len(differ)} of "
                  f"{len(across)} prompts" + (f" (not for: {', '.join(differ)})." if differ else "."), ""]
    lines += ["![B/A per prompt](ratio.png)", "", "![aggregate tok/s](aggregate.png)", ""]
    return "\n".join(lines)


# ---- the index ---------------------------------------------------------------------------------


def render_index(results_dir: Path, index: Path) -> str:
    rel = Path(os.path.relpath(results_dir, index.parent))
    lines = ["# Results windows", "",
             "Generated by `patchbay results` from the window folders; do not edit "
             "(`patchbay results --check` fails while it is stale). One folder per measurement: "
             "the command, settings, machine, raw records, summary and plots.", ""]
    found = existing(results_dir)
    if not found:
        return "\n".join(lines + ["No windows yet: `patchbay ab ... --window SLUG` makes one.", ""])
    lines += ["| window | slug | date | command | headline |", "|---|---|---|---|---|"]
    for number, slug, path in found:
        try:
            created = json.loads((path / "config.json").read_text()).get("created", "")[:10]
        except (OSError, ValueError):
            created = "?"
        command = (path / "command.txt").read_text().strip() if (path / "command.txt").is_file() else "?"
        try:
            headline = json.loads((path / "summary.json").read_text())["headline"]
        except (OSError, ValueError, KeyError):
            headline = "incomplete: no summary.json"
        link = (rel / path.name / "SUMMARY.md").as_posix()
        lines.append(f"| [W{number:02d}]({link}) | {slug} | {created} | `{_cell(command)}` | {_cell(headline)} |")
    return "\n".join(lines + [""])

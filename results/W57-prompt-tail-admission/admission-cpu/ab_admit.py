"""Paired A/B of admission (admit_s: arrival -> engine queue) on two engine builds served side by side.

A = the committed HEAD's build, B = the working tree's build. Both servers are started with
patchbay's own launcher (patchbay.runtime.launch.start) from config/local.env.example (the
`local` knob set, synthetic:tiny, context 65536, CPU, continuous batching, --cb-num-blocks 256
--cb-max-batch-tokens 1024), each on its own port and run folder. Every request goes to both
servers back to back (order AB on even reps, BA on odd reps); admit_s / ttft_s are read from
each server's `pb-request {json}` log lines, matched by x-request-id.

Cases per rep: long-cold (turn 0: a fresh ~32K-token conversation, cold prefix), long (turns
1..N: the conversation resent with ~385 new tokens per turn: an assistant reply of ~150 and a
user message of ~235), short (~400-token prompts, a fresh text each, control).

usage: ab_admit.py OUTDIR A_BUILD_ID B_BUILD_ID [--reps R] [--turns N] [--shorts S]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import statistics as st
import sys
import time
from pathlib import Path

import httpx
from tokenizers import Tokenizer

from patchbay import ROOT
from patchbay.runtime import config as pbconfig
from patchbay.runtime import launch
from patchbay.runtime.models import model_path
from patchbay.series.build import Engine

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("a_build")
ap.add_argument("b_build")
ap.add_argument("--reps", type=int, default=6)
ap.add_argument("--turns", type=int, default=5)
ap.add_argument("--shorts", type=int, default=6)
ap.add_argument("--ports", default="8211,8212")
args = ap.parse_args()
OUT = Path(args.out)
OUT.mkdir(parents=True, exist_ok=True)
WORK = OUT.parent

ARMS = {}
for arm, bid, port in zip("AB", (args.a_build, args.b_build), args.ports.split(",")):
    site = ROOT / "build" / "engines" / bid
    assert (site / ".complete").read_text().strip() == bid, site
    env = dict(os.environ, PATCHBAY_PORT=port, PATCHBAY_RUN_DIR=str(WORK / f"run-{arm}"))
    cfg = pbconfig.load(ROOT / "config" / "local.env.example", environ=env)
    ARMS[arm] = {"build": bid, "cfg": cfg, "engine": Engine(bid, Path("/nonexistent.whl"), site),
                 "files": launch.RunFiles(cfg.run_path)}

cfg0 = ARMS["A"]["cfg"]
MODEL_PATH = model_path(cfg0)
MODEL = Path(MODEL_PATH).name
tok = Tokenizer.from_file(f"{MODEL_PATH}/tokenizer.json")

# text: the previous probe's source (stdlib .py files, in sorted order), consumed front to back
files = sorted(glob.glob("/usr/lib/python3*/**/*.py", recursive=True))
TEXT = "\n".join(open(f, errors="replace").read() for f in files[:400])
pos = 0


def take(ntok: int) -> str:
    global pos
    chunk = TEXT[pos:pos + ntok * 3]
    n = len(tok.encode(chunk).ids)
    chunk = TEXT[pos:pos + int(len(chunk) * ntok / max(n, 1))]
    pos += len(chunk)
    return chunk


def count(msgs) -> int:
    return sum(len(tok.encode(m["content"]).ids) for m in msgs)


MASK = re.compile(r'"(id|created|system_fingerprint)":("[^"]*"|\d+)')


def send(arm: str, msgs, tag: str) -> dict:
    url = ARMS[arm]["cfg"].url + "/v1/chat/completions"
    body = {"model": MODEL, "messages": msgs, "stream": True, "max_tokens": 2,
            "stream_options": {"include_usage": True}}
    lines, t0, first = [], time.perf_counter(), None
    with httpx.stream("POST", url, json=body, timeout=600, headers={"x-request-id": tag}) as r:
        status = r.status_code
        for line in r.iter_lines():
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - t0
            lines.append(line)
    raw = "\n".join(lines)
    fps = set(re.findall(r'"system_fingerprint":"([^"]*)"', raw))
    assert fps == {ARMS[arm]["build"]}, (tag, fps)  # the only masked field besides id/created: the build id
    return {"status": status, "client_s": time.perf_counter() - t0, "client_first_s": first,
            "masked": MASK.sub(r'"\1":X', raw), "raw": raw}


def both(order: str, msgs, tag: str) -> dict:
    return {arm: send(arm, msgs, f"{tag}-{arm}") for arm in order}


def main() -> None:
    sent = []  # (arm, case, turn, rep, tag, client result)
    dumps = {a: open(OUT / f"sse-{a}.txt", "w") for a in "AB"}
    started = []
    try:
        for arm, a in ARMS.items():
            t = time.monotonic()
            info = launch.start(a["cfg"], a["engine"], MODEL_PATH, a["files"], progress=lambda *_: None)
            started.append(arm)
            a["knobs"] = info["knobs"]
            print(f"{arm}: {a['build']} on {a['cfg'].url} pid {info['pid']} ready in {time.monotonic() - t:.0f}s",
                  flush=True)
        assert ARMS["A"]["knobs"] == ARMS["B"]["knobs"]

        def record(order, msgs, case, turn, rep):
            tag = f"{case}-r{rep}-t{turn}"
            res = both(order, msgs, tag)
            for arm in order:
                dumps[arm].write(f"### {tag}\n{res[arm]['masked']}\n")
                sent.append((arm, case, turn, rep, f"{tag}-{arm}", res[arm], res["A"]["masked"] == res["B"]["masked"]))
            return res

        for i in range(3):  # warm-up, both servers, not summarized
            record("AB", [{"role": "system", "content": "You are a coding agent."},
                          {"role": "user", "content": take(400)}], "warmup", i, -1)
        for rep in range(args.reps):
            order = "AB" if rep % 2 == 0 else "BA"
            msgs = [{"role": "system", "content": "You are a coding agent.\n" + take(1500)}]
            while count(msgs) < 31000:
                msgs.append({"role": "user", "content": take(2500)})
                msgs.append({"role": "assistant", "content": take(1500)})
            msgs.append({"role": "user", "content": take(385)})
            for turn in range(args.turns + 1):
                t = time.monotonic()
                record(order, msgs, "long-cold" if turn == 0 else "long", turn, rep)
                print(f"rep {rep} turn {turn} ({order}): {count(msgs)} content tokens, "
                      f"{time.monotonic() - t:.1f}s", flush=True)
                msgs.append({"role": "assistant", "content": take(150)})
                msgs.append({"role": "user", "content": take(235)})
            for i in range(args.shorts):
                record(order, [{"role": "system", "content": "You are a coding agent."},
                               {"role": "user", "content": take(400)}], "short", i, rep)
        time.sleep(1.0)
    finally:
        for f in dumps.values():
            f.close()
        for arm in started:
            launch.stop(ARMS[arm]["files"])

    logs = {}
    for arm, a in ARMS.items():
        text = a["files"].log.read_text(errors="replace")
        (OUT / f"server-{arm}.log").write_text(text)
        for line in text.splitlines():
            if "pb-request " in line:
                d = json.loads(line.split("pb-request ", 1)[1])
                logs[d["id"]] = d
    rows = []
    for arm, case, turn, rep, tag, res, same in sent:
        d = logs[tag]
        assert d["status"] == 200 == res["status"], (tag, d)
        rows.append({"arm": arm, "build": ARMS[arm]["build"], "case": case, "turn": turn, "rep": rep,
                     "prompt_tokens": d["prompt_tokens"], "admit_s": d["admit_s"], "ttft_s": d["ttft_s"],
                     "queue_s": d["queue_s"], "duration_s": d["duration_s"],
                     "client_first_chunk_s": round(res["client_first_s"], 6), "reply_same_as_other_arm": same})
    with open(OUT / "rows.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    summarize(rows)


def boot_ratio(rows, case, metric, n=10000, seed=0):
    """B/A ratio of medians, 95% CI from resampling reps (each rep's rows of both arms kept together)."""
    reps = sorted({r["rep"] for r in rows if r["case"] == case})
    by = {(r["arm"], r["rep"]): [] for r in rows if r["case"] == case}
    for r in rows:
        if r["case"] == case:
            by[(r["arm"], r["rep"])].append(r[metric])
    def ratio(sample):
        a = [v for rep in sample for v in by[("A", rep)]]
        b = [v for rep in sample for v in by[("B", rep)]]
        return st.median(b) / st.median(a)
    rng = random.Random(seed)
    boots = sorted(ratio([rng.choice(reps) for _ in reps]) for _ in range(n))
    return ratio(reps), boots[int(0.025 * n)], boots[int(0.975 * n) - 1]


def summarize(rows):
    summary = {"builds": {a: ARMS[a]["build"] for a in "AB"}, "knobs_on": ARMS["A"].get("knobs"),
               "machine": "this CPU host, 2 cores (nproc=%d)" % os.cpu_count(), "cases": {}}
    lines = []
    for case in ("short", "long", "long-cold"):
        cr = [r for r in rows if r["case"] == case]
        if not cr:
            continue
        c = {"n_per_arm": sum(r["arm"] == "A" for r in cr), "reps": len({r["rep"] for r in cr}),
             "prompt_tokens_median": st.median(r["prompt_tokens"] for r in cr)}
        for m in ("admit_s", "ttft_s"):
            for arm in "AB":
                v = [r[m] for r in cr if r["arm"] == arm]
                c[f"{m}_median_{arm}"] = st.median(v)
            ratio, lo, hi = boot_ratio(rows, case, m)
            c[f"{m}_ratio_B_over_A"] = ratio
            c[f"{m}_ratio_ci95"] = [lo, hi]
            lines.append(f"{case:9} {m:8} A {c[f'{m}_median_A']*1000:8.2f} ms  B {c[f'{m}_median_B']*1000:8.2f} ms  "
                         f"B/A {ratio:.3f} [{lo:.3f}, {hi:.3f}]")
        c["replies_identical"] = all(r["reply_same_as_other_arm"] for r in cr)
        summary["cases"][case] = c
    summary["replies_identical_all"] = all(r["reply_same_as_other_arm"] for r in rows)
    summary["requests_compared"] = len(rows) // 2
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print("\n".join(lines))
    print("replies identical (id/created/system_fingerprint masked):", summary["replies_identical_all"],
          f"over {summary['requests_compared']} request pairs")


if __name__ == "__main__":
    main()

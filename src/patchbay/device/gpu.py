"""The GPU jobs: A/B runs of air12 or a checkpoint through `patchbay ab` (one server, or two side
by side for settings read at start), exactness and the agent API's checks on the GPU, the
window they make, and the wheels `scripts/gpu-run.sh` installs there (gathered here:
`python -m patchbay.device wheels`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from ..runtime.config import ConfigError, knob_set
from .servers import AIR12, engine_path, start_serving, with_server, with_servers

# What the device image lacks for `transformers serve` (its torch, numpy, tokenizers, safetensors,
# huggingface_hub, httpx and typer do), pinned like pyproject.toml's engine extra.
# The GPU-marked kernel tests (tests/test_kernels_gpu.py) need these; `wheels --no-tests` leaves them out.
TEST_ONLY = ["pytest==9.2.0", "pluggy==1.7.0", "iniconfig==2.3.1", "pygments==2.21.0"]
CARRIED = ["fastapi==0.165.0", "starlette==1.10.0", "uvicorn==0.54.0", "pydantic==2.14.4",
           "pydantic_core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
           "openai==3.57.0", "jiter==0.19.0", "distro==1.9.0", "sniffio==1.3.1", "opentelemetry-api==1.45.2",
           "httpx2==2.16.2", "httpcore2==2.16.2", "truststore==0.10.5",
           # structured output (0130); the device's own triton serves xgrammar
           "xgrammar==0.2.9", "apache-tvm-ffi==0.1.15.post2",
           # /metrics (0580); pure Python
           "prometheus_client==0.26.0", *TEST_ONLY]
# What one device call carries at most: the tree git sees plus the carried paths. Its own count
# came out a little above this one's (it refused 63.4 MiB counted here), so leave a margin.
CARRY_LIMIT, CARRY_MARGIN = 64 * 2**20, 2 * 2**20
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]


def gather_wheels(dest: Path, engine_wheels: list[Path], tests: bool = True) -> list[Path]:
    """Download the carried packages as cp312 wheels for x86-64 and copy the engine wheels;
    without `tests`, pytest and its own dependencies stay out (and any left from before go)."""
    dest.mkdir(parents=True, exist_ok=True)
    carried = CARRIED if tests else [c for c in CARRIED if c not in TEST_ONLY]
    if not tests:
        for spec in TEST_ONLY:
            for stale in dest.glob(spec.split("==")[0].replace("-", "_") + "-*.whl"):
                stale.unlink()
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    proc = subprocess.run(cmd + carried, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed: {proc.stderr.strip().splitlines()[-1:]}")
    for stale in dest.glob("transformers-*.whl"):
        stale.unlink()
    for wheel in engine_wheels:
        (dest / wheel.name).write_bytes(wheel.read_bytes())
    return sorted(dest.glob("*.whl"))


def tree_bytes(root: Path) -> int:
    """The bytes of the files a device call copies from `root`: tracked ones and untracked ones
    that git does not ignore."""
    names = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((root / os.fsdecode(n)).stat().st_size for n in names if n and (root / os.fsdecode(n)).is_file())


def carry_report(root: Path, carried: list[Path]) -> str:
    """One line: what a call carrying `carried` from `root` weighs against the device's limit."""
    mib = 2**20
    tree, extra = tree_bytes(root), sum(p.stat().st_size for p in carried)
    verdict = ("fits" if tree + extra <= CARRY_LIMIT - CARRY_MARGIN
               else "too close to the limit or over it: leave something out (--no-tests)")
    return (f"carry: tree {tree / mib:.1f} MiB + wheels {extra / mib:.1f} MiB = {(tree + extra) / mib:.1f} MiB "
            f"of {CARRY_LIMIT / mib:.0f}: {verdict}")




def side_by_side(cuda_graphs: bool, port: int, envs: list[dict], num_blocks: int, logs: Path,
                 ab_args: list[str], model_dir: str | None = None, tps: tuple[int, int] = (1, 1),
                 device: str = "cuda", score: Path | None = None,
                 engines: tuple[str | None, str | None] = (None, None),
                 models: tuple[str, str] = (AIR12, AIR12)) -> int:
    """`patchbay ab` between two servers side by side, for settings read at start: A on `port`
    with envs[0], B on port + 1 with envs[1], each with a fixed KV pool. Without `model_dir`
    each is air12 built in memory from the same seed on GPU 0 (two 54 GB models and their pools
    fit an H200); with it, each serves that checkpoint as tps[arm] tensor-parallel ranks (rank r
    on GPU r). The passes alternate A B A B as for per-request knobs, one server busy at a time.
    With `score`, the exactness prompts' greedy replies are then compared (`patchbay exact
    --b-url`, 64 tokens) and the reference texts forced through both servers (`patchbay score
    --url`, both need PB_FORCED_DECODING=1); the rows and |Δ logprob| tables land there as JSON.
    `engines` puts another engine folder first on an arm's PYTHONPATH (two builds, one knob set:
    with --score, whether a change of the engine's code kept its bits). Without `model_dir`,
    `models` names what each arm builds in memory (servers.MODELS: air12 against air12-fp8, say);
    B's requests then name its own."""
    from ..measure.verbs import run

    logs.mkdir(parents=True, exist_ok=True)

    def job(procs: list) -> int:
        for n, (arm, env, tp, engine) in enumerate(zip("AB", envs, tps, engines)):
            print(f"arm {arm}: TP={tp}, {json.dumps(env) if env else 'no PB_* variables'}"
                  + (f", engine {engine}" if engine else ""), flush=True)
            env = {**env, "PYTHONPATH": engine_path(engine)} if engine else env
            procs += start_serving(model_dir, tp, port + n, env, logs / f"server-{arm}", cuda_graphs, num_blocks,
                                   device, rdzv_port=29600 + n, model_name=models[n])
        a_url, b_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
        names = ["--model", model_dir or models[0]]
        names += ["--b-model", models[1]] if not model_dir and models[1] != models[0] else []
        rc = run("ab", ["--url", a_url, "--b-url", b_url, *names, *ab_args])
        if score is not None:  # teacher forcing through both servers: B against A, A batched against A
            score.mkdir(parents=True, exist_ok=True)
            print("greedy replies of the exactness prompts, B against A (a difference is a finding, not a "
                  "failure):", flush=True)
            run("exact", ["--url", a_url, "--b-url", b_url, *names,
                          "--max-tokens", "64", "--json", str(score / "greedy-b-vs-a.json")])
            for name, args in (("b-vs-a", ["--b-url", b_url]), ("a-together-vs-a-alone", ["--together"])):
                print(f"teacher-forced |Δ logprob|, {name}:", flush=True)
                b_names = names if name == "b-vs-a" else names[:2]
                rc = run("score", ["--url", a_url, *args, *b_names, "--json", str(score / f"{name}.json")]) or rc
        return rc

    return with_servers(job)


def checkpoint_ab(model_dir: str, tp: int, port: int, cuda_graphs: bool, num_blocks: int, logs: Path,
                  ab_args: list[str], device: str = "cuda") -> int:
    """`patchbay ab` against one server of `model_dir` as `tp` ranks, started with the production
    knob set (config/knob-sets.toml, [prod]): for a model only one layout can hold, where the arms are
    per-request knobs, or A against A to read the layout's own speed."""
    from ..measure.verbs import run

    knobs = knob_set("prod")
    print(f"one server: TP={tp}, production knobs {json.dumps(knobs)}", flush=True)

    def job(procs: list) -> int:
        procs += start_serving(model_dir, tp, port, knobs, logs / "server", cuda_graphs, num_blocks, device)
        return run("ab", ["--url", f"http://127.0.0.1:{port}", "--model", model_dir, *ab_args])

    return with_servers(job)


def parse_env(text: str, flag: str) -> dict[str, str]:
    """An arm's environment from --a-env/--b-env: a JSON object of PB_* names to values, or a named
    knob set of config/knob-sets.toml, `@prod`, optionally changed by one: `@prod+{"PB_X": 1}`."""
    knobs: dict[str, str] = {}
    if text.startswith("@"):
        name, plus, text = text[1:].partition("+")
        try:
            knobs = knob_set(name)
        except ConfigError as e:
            raise SystemExit(f"{flag}: {e}") from None
        if not plus:
            return knobs
    try:
        value = json.loads(text)
    except ValueError as e:
        raise SystemExit(f"{flag}: not JSON ({e})")
    if not isinstance(value, dict) or not all(isinstance(k, str) and k.startswith("PB_") for k in value):
        raise SystemExit(f"{flag}: expected a JSON object of PB_* names to values, e.g. '{{\"PB_X\": \"1\"}}', "
                         "or a knob set, e.g. @prod")
    return {**knobs, **{k: "1" if v is True else "0" if v is False else str(v) for k, v in value.items()}}


def exact_job(out: Path) -> int:
    """Exactness item 1 on the GPU: the same requests to pristine upstream and to the patched build
    with every knob unset (each engine first on PYTHONPATH, as scripts/gpu-run.sh installs them)."""
    from ..measure import exact

    transcripts = {}
    for n, engine in enumerate(("upstream", "patched")):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PB_")},
               "PYTHONPATH": engine_path(f"/tmp/pb-engine-{engine}")}

        def job(url, engine=engine):
            transcripts[engine] = exact.http_transcript(url, AIR12)
            return 0

        log = out / f"server-{engine}.log"
        if with_server(False, 8100 + n, job, log=log, env=env) != 0:
            return 1
    diffs = exact.differences(transcripts["patched"], transcripts["upstream"])
    (out / "exact.json").write_text(json.dumps({"differences": diffs, "transcripts": transcripts}, indent=1))
    print(f"{len(transcripts['upstream'])} requests, {len(diffs)} differ" + "".join(f"\n  {d}" for d in diffs))
    return 1 if diffs else 0


def agent_job(out: Path, cuda_graphs: bool, ab_args: list[str], graph_sampling: bool = False) -> int:
    """The agent API's device-dependent checks on air12 (gpu_agent), and without CUDA graphs the
    cost of patchbay's reply path: `patchbay ab` with every path knob off (A) against on (B)."""
    from ..measure.verbs import run
    from . import gpu_agent

    out.mkdir(parents=True, exist_ok=True)
    part = ("cuda-graphs" if cuda_graphs else "no-graphs") + ("+graph-sampling" if graph_sampling else "")
    results = {}

    def job(url):
        results[part] = gpu_agent.checks(url, AIR12, cuda_graphs, graph_sampling)
        if cuda_graphs or not ab_args:
            return 0
        off = json.dumps({k: 0 for k in gpu_agent.PATH_KNOBS})
        on = json.dumps({k: 1 for k in gpu_agent.PATH_KNOBS})
        return run("ab", ["--url", url, "--model", AIR12, "--a-json", off, "--b-json", on,
                          "--results-dir", str(out), "--window", "agent-path", *ab_args])

    env = {**os.environ, **gpu_agent.KNOBS, **({"PB_GRAPH_SAMPLING": "1"} if graph_sampling else {})}
    code = with_server(cuda_graphs, 8120, job, log=out / f"server-{part}.log", env=env)
    ok = gpu_agent.write_report(out, results) if results else False
    (out / f"agent-{part}.json").write_text(json.dumps(results, indent=1) + "\n")
    return code or (0 if ok else 1)


def assemble(results_dir: Path, slug: str, parts: list[tuple[str, Path, str]], exact_json: Path | None,
             title: str) -> Path:
    """One window from several `ab` windows run on the GPU (one per server setting) and an exact
    run: each part keeps its own files in a subfolder; the top SUMMARY.md sets their aggregate
    throughput next to the roofline of synthetic:air12."""
    import shutil

    from ..measure import roofline, windows
    from ..runtime.synth import air12_config

    config = air12_config()
    window = windows.create(results_dir, slug)
    rows, summary = [], {"parts": {}, "roofline_tok_s": {}}
    for name, src, note in parts:
        shutil.copytree(src, window / name)
        part = json.loads((src / "summary.json").read_text())
        summary["parts"][name] = {"note": note, "levels": {}}
        for level, data in part["levels"].items():
            agg = data["aggregate"]
            roof = roofline.tokens_per_s(config, int(level))
            summary["roofline_tok_s"][level] = roof
            both = [v for v in (agg["A_tps"], agg["B_tps"]) if v is not None]
            per_stream = [row[arm]["decode_tps"] for row in data["prompts"].values() for arm in "AB"
                          if row[arm].get("decode_tps")]
            ttft = [row[arm]["ttft_s"] for row in data["prompts"].values() for arm in "AB" if row[arm].get("ttft_s")]
            entry = {"A_tps": agg["A_tps"], "B_tps": agg["B_tps"], "tps": sum(both) / len(both),
                     "per_stream_decode_tps": sum(per_stream) / len(per_stream), "ttft_s": sum(ttft) / len(ttft),
                     "roofline_tok_s": roof}
            entry["of_roofline"] = entry["tps"] / roof
            summary["parts"][name]["levels"][level] = entry
            rows.append(f"| {name} | C{level} | {entry['tps']:.1f} | {agg['A_tps']:.1f} / {agg['B_tps']:.1f} | "
                        f"{entry['per_stream_decode_tps']:.1f} | {1000 * entry['ttft_s']:.0f} | {roof:.0f} | "
                        f"{entry['of_roofline']:.3f} |")
    lines = [f"# W{window.name[1:3]}: {title}", ""]
    if exact_json is not None:
        shutil.copy(exact_json, window / "exact.json")
        diffs = json.loads(exact_json.read_text())["differences"]
        summary["exact_differences"] = len(diffs)
        lines += [f"Exactness on the GPU (`python -m patchbay.device exact`): the same requests to pristine upstream "
                  f"and to the patched build with every knob unset gave {len(diffs)} differing responses "
                  f"(`exact.json`).", ""]
    lines += ["Aggregate tok/s is completion tokens over each pass's wall time (the mean of the two arms of an "
              "A/A run, both arms sending the same request); per-stream decode tok/s counts tokens after the "
              "first; the roofline is the H200's 4.16 TB/s over the bf16 weight bytes one step reads "
              "(`patchbay.measure.roofline`).", "",
              "| server setting | level | aggregate tok/s | arm A / B | per-stream decode tok/s | TTFT ms | "
              "roofline tok/s | of roofline |", "|---|---|---:|---:|---:|---:|---:|---:|", *rows, ""]
    for name, _src, note in parts:
        lines += [f"- `{name}/`: {note}"]
    best = max((e["tps"], n, lv) for n, p in summary["parts"].items() for lv, e in p["levels"].items())
    summary["headline"] = f"best: {best[1]} C{best[2]} {best[0]:.0f} tok/s ({best[0] / summary['roofline_tok_s'][best[2]]:.3f} of roofline)"
    (window / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (window / "SUMMARY.md").write_text("\n".join(lines) + "\n")
    commands = [f"{name}: {(src / 'command.txt').read_text().strip()}" for name, src, _ in parts]
    (window / "command.txt").write_text("\n".join(commands) + "\n")
    first = json.loads((parts[0][1] / "config.json").read_text())
    (window / "config.json").write_text(json.dumps({"created": first.get("created"), "parts": [p[0] for p in parts],
                                                    "model": AIR12}, indent=2) + "\n")
    return window

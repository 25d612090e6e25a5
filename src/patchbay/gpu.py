"""The GPU runner: serve `synthetic:air12` on a GPU machine that has torch but no network.

`python -m patchbay.gpu serve --port P [--cuda-graphs]` builds air12 on the GPU from its seed
(54 GB of bf16, about a second; no files) and serves it with the engine on PYTHONPATH through
`transformers serve`'s own handlers: the serve command is constructed exactly as its CLI does,
without a model, and the in-memory model is then registered as the one model it serves
(upstream loads models by path only). `scripts/gpu-run.sh` installs the carried wheels
first; `patchbay gpu-wheels` gathers them here.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import ROOT, load_hooks
from .config import ConfigError, knob_set

AIR12 = "synthetic:air12"
# What the device image lacks for `transformers serve` (its torch, numpy, tokenizers, safetensors,
# huggingface_hub, httpx and typer do), pinned like pyproject.toml's engine extra.
CARRIED = ["fastapi==0.165.0", "starlette==1.10.0", "uvicorn==0.54.0", "pydantic==2.14.4",
           "pydantic_core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
           "openai==3.57.0", "jiter==0.19.0", "distro==1.9.0", "sniffio==1.3.1", "opentelemetry-api==1.45.2",
           "httpx2==2.16.2", "httpcore2==2.16.2", "truststore==0.10.5",
           # structured output (0130); the device's own triton serves xgrammar
           "xgrammar==0.2.9", "apache-tvm-ffi==0.1.15.post2",
           # the GPU-marked kernel tests (tests/test_kernels_gpu.py)
           "pytest==9.2.0", "pluggy==1.7.0", "iniconfig==2.3.1", "pygments==2.21.0"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64"]


def gather_wheels(dest: Path, engine_wheels: list[Path]) -> list[Path]:
    """Download the carried packages as cp312 wheels for x86-64 and copy the engine wheels."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", str(dest)]
    for platform in PLATFORMS:
        cmd += ["--platform", platform]
    proc = subprocess.run(cmd + CARRIED, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip download failed: {proc.stderr.strip().splitlines()[-1:]}")
    for stale in dest.glob("transformers-*.whl"):
        stale.unlink()
    for wheel in engine_wheels:
        (dest / wheel.name).write_bytes(wheel.read_bytes())
    return sorted(dest.glob("*.whl"))


def serve_air12(port: int, cuda_graphs: bool, seed: int = 0, host: str = "127.0.0.1", compile: bool = False,
                num_blocks: int | None = None):
    """Start the engine's server in this process with air12 registered; returns the Serve object."""
    import torch
    from transformers.cli.serve import Serve
    from transformers.cli.serving.model_manager import TimedModel

    from .synth import build_air12, padded_tokenizer

    # Upstream's batching logger says which CUDA-graph paths it chose; keep that in the log.
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.INFO)
    t0 = time.monotonic()
    model = build_air12("cuda", seed=seed)
    tokenizer = padded_tokenizer(model.config.vocab_size)
    # The load sequence a checkpoint would pass through: 0220 picks the experts implementation,
    # 0280-0390 swap modeling forwards, 0310 fuses weights, 0450 compiles, each when its knob is on.
    load = load_hooks.sequence()
    if load is not None:
        chosen = load.before({}).get("experts_implementation")
        if chosen:
            model.set_experts_implementation(chosen)
        load.after(model)
    torch.cuda.synchronize()
    print(f"air12 built on {torch.cuda.get_device_name()} in {time.monotonic() - t0:.1f}s, "
          f"experts={model.config._experts_implementation}, attn={model.config._attn_implementation}", flush=True)
    # --compile reaches only upstream's sequential path (static cache + torch.compile), not its batching.
    serve = Serve(force_model=None, continuous_batching=not compile, cb_use_cuda_graph=cuda_graphs or None,
                  compile=compile, host=host, port=port, device="cuda", log_level="info", non_blocking=True,
                  cb_num_blocks=num_blocks)
    manager = serve._model_manager
    manager.model_timeout = -1
    manager.loaded_models[f"{AIR12}@main"] = TimedModel(model, timeout_seconds=-1, processor=tokenizer)
    manager.force_model = AIR12
    return serve


def profiled(cmd: list[str], profile_dir: Path | None) -> list[str]:
    """`python -m MODULE ARGS` run under `patchbay.served_profile` (windows into profile_dir)."""
    if profile_dir is None:
        return cmd
    assert cmd[1] == "-m", cmd
    return [cmd[0], "-m", "patchbay.served_profile", str(profile_dir), "--", *cmd[2:]]


def start_server(cuda_graphs: bool, port: int, log: Path, env: dict | None = None, compile: bool = False,
                 ready_timeout: float = 900.0, num_blocks: int | None = None,
                 profile_dir: Path | None = None) -> subprocess.Popen:
    """`serve` in its own process (the load generator must not share its interpreter), returned
    once it has streamed a token; RuntimeError with the log's tail when it exits or never gets there."""
    cmd = [sys.executable, "-m", "patchbay.gpu", "serve", "--port", str(port)]
    cmd += (["--cuda-graphs"] if cuda_graphs else []) + (["--compile"] if compile else [])
    cmd += ["--num-blocks", str(num_blocks)] if num_blocks else []
    cmd = profiled(cmd, profile_dir)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    seconds = wait_ready([proc], [log], f"http://127.0.0.1:{port}", AIR12, ready_timeout)
    print(f"ready in {seconds:.0f}s (cuda graphs {'on' if cuda_graphs else 'off'}"
          f"{', compile, no batching' if compile else ''})", flush=True)
    return proc


def wait_ready(procs: list, logs: list[Path], url: str, model: str, ready_timeout: float) -> float:
    """Seconds until the server at `url` streams a token. When one of its processes exits first
    or the time runs out, every process is stopped and RuntimeError carries that log's tail."""
    from .launch import first_streamed_token, log_tail

    t0 = time.monotonic()
    while not first_streamed_token(url, model):
        exited = [n for n, proc in enumerate(procs) if proc.poll() is not None]
        if exited or time.monotonic() - t0 > ready_timeout:
            for proc in procs:
                stop_server(proc)
            n = exited[0] if exited else 0
            who = "server" if len(procs) == 1 else f"rank {n}"
            why = f"{who} exited with {procs[n].returncode}" if exited else f"not ready in {ready_timeout:.0f}s"
            raise RuntimeError(f"{why}:\n{log_tail(logs[n], 40)}")
        time.sleep(2)
    return time.monotonic() - t0


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_ranks(model_dir: str, tp: int, port: int, env: dict, log_dir: Path, device: str = "cuda",
                engine_args: str = "", rdzv_port: int = 29600, ready_timeout: float = 1800.0,
                profile_dir: Path | None = None) -> list:
    """`transformers serve MODEL_DIR` as `tp` tensor-parallel ranks on this machine (rank r on
    GPU r, NVLink multicast off), the engine and packages from this process's PYTHONPATH (as
    scripts/gpu-run.sh sets it): the launch of the local runtime, for a machine where patchbay
    cannot build. Returns the rank processes once rank 0 streamed a token; RuntimeError with a
    rank's log tail when one exits first. With `profile_dir`, rank r runs under
    `patchbay.served_profile` with its windows in profile_dir/rank{r}."""
    import dataclasses

    from .config import Config
    from .launch import engine_command, rank_env

    knobs = {**env, **({"PB_TENSOR_PARALLEL": "1"} if tp > 1 else {})}
    cfg = dataclasses.replace(Config(), host="127.0.0.1", port=port, device=device, tp=tp, rdzv_port=rdzv_port,
                              continuous_batching=True, engine_args=engine_args, knobs=knobs)
    base = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(tp):
        with (log_dir / f"rank{rank}.log").open("w") as log:
            cmd = profiled(engine_command(cfg, model_dir), profile_dir / f"rank{rank}" if profile_dir else None)
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                          env={**base, **knobs, **rank_env(cfg, rank)}, stdin=subprocess.DEVNULL))
    logs = [log_dir / f"rank{rank}.log" for rank in range(tp)]
    seconds = wait_ready(procs, logs, f"http://127.0.0.1:{port}", model_dir, ready_timeout)
    print(f"{tp} rank(s) ready in {seconds:.0f}s", flush=True)
    return procs


def start_serving(model_dir: str | None, tp: int, port: int, env: dict, logs: Path, cuda_graphs: bool,
                  num_blocks: int, device: str = "cuda", rdzv_port: int = 29600,
                  profile_dir: Path | None = None) -> list:
    """air12 built in memory as one process (no `model_dir`; its log is logs.log), or `model_dir`
    as `tp` ranks (their logs in logs/). With `profile_dir`, rank r runs under
    patchbay.served_profile with its windows in profile_dir/rank{r}."""
    if model_dir is None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}
        return [start_server(cuda_graphs, port, logs.with_suffix(".log"), {**base, **env}, num_blocks=num_blocks,
                             profile_dir=profile_dir / "rank0" if profile_dir else None)]
    args = f"--cb-num-blocks {num_blocks}" + (" --cb-use-cuda-graph" if cuda_graphs else "")
    return start_ranks(model_dir, tp, port, env, logs, device=device, engine_args=args, rdzv_port=rdzv_port,
                       profile_dir=profile_dir)


def with_servers(job) -> int:
    """job(procs) starts its servers into `procs` and returns an exit code. A RuntimeError (a
    server that never got ready, a failed measurement) is printed as it is and gives 1; every
    process started is stopped at the end."""
    procs: list = []
    try:
        return job(procs)
    except RuntimeError as e:
        print(e, flush=True)
        return 1
    finally:
        for proc in procs:
            stop_server(proc)


def with_server(cuda_graphs: bool, port: int, job, ready_timeout: float = 900.0, log: Path | None = None,
                env: dict | None = None, compile: bool = False) -> int:
    """Start `serve`, run job(url), stop the server. Returns job's exit code."""
    log = log or Path(f"/tmp/pb-air12-{port}.log")
    try:
        proc = start_server(cuda_graphs, port, log, env, compile, ready_timeout)
    except RuntimeError as e:
        print(e, flush=True)
        return 1
    try:
        return job(f"http://127.0.0.1:{port}")
    finally:
        stop_server(proc)


def side_by_side(cuda_graphs: bool, port: int, envs: list[dict], num_blocks: int, logs: Path,
                 ab_args: list[str], model_dir: str | None = None, tps: tuple[int, int] = (1, 1),
                 device: str = "cuda", score: Path | None = None) -> int:
    """`patchbay ab` between two servers side by side, for settings read at start: A on `port`
    with envs[0], B on port + 1 with envs[1], each with a fixed KV pool. Without `model_dir`
    each is air12 built in memory from the same seed on GPU 0 (two 54 GB models and their pools
    fit an H200); with it, each serves that checkpoint as tps[arm] tensor-parallel ranks (rank r
    on GPU r). The passes alternate A B A B as for per-request knobs, one server busy at a time.
    With `score`, the exactness prompts' greedy replies are then compared (`patchbay exact
    --b-url`, 64 tokens) and the reference texts forced through both servers (`patchbay score
    --url`, both need PB_FORCED_DECODING=1); the rows and |Δ logprob| tables land there as JSON."""
    from .cli import main as patchbay_main

    logs.mkdir(parents=True, exist_ok=True)

    def job(procs: list) -> int:
        for n, (arm, env, tp) in enumerate(zip("AB", envs, tps)):
            print(f"arm {arm}: TP={tp}, {json.dumps(env) if env else 'no PB_* variables'}", flush=True)
            procs += start_serving(model_dir, tp, port + n, env, logs / f"server-{arm}", cuda_graphs, num_blocks,
                                   device, rdzv_port=29600 + n)
        a_url, b_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"
        rc = patchbay_main(["ab", "--url", a_url, "--b-url", b_url, "--model", model_dir or AIR12, *ab_args])
        if score is not None:  # teacher forcing through both servers: B against A, A batched against A
            score.mkdir(parents=True, exist_ok=True)
            print("greedy replies of the exactness prompts, B against A (a difference is a finding, not a "
                  "failure):", flush=True)
            patchbay_main(["exact", "--url", a_url, "--b-url", b_url, "--model", model_dir or AIR12,
                           "--max-tokens", "64", "--json", str(score / "greedy-b-vs-a.json")])
            for name, args in (("b-vs-a", ["--b-url", b_url]), ("a-together-vs-a-alone", ["--together"])):
                print(f"teacher-forced |Δ logprob|, {name}:", flush=True)
                rc = patchbay_main(["score", "--url", a_url, *args, "--model", model_dir or AIR12,
                                    "--json", str(score / f"{name}.json")]) or rc
        return rc

    return with_servers(job)


def checkpoint_ab(model_dir: str, tp: int, port: int, cuda_graphs: bool, num_blocks: int, logs: Path,
                  ab_args: list[str], device: str = "cuda") -> int:
    """`patchbay ab` against one server of `model_dir` as `tp` ranks, started with the production
    knob set (config/knob-sets.toml, [prod]): for a model only one layout can hold, where the arms are
    per-request knobs, or A against A to read the layout's own speed."""
    from .cli import main as patchbay_main

    knobs = knob_set("prod")
    print(f"one server: TP={tp}, production knobs {json.dumps(knobs)}", flush=True)

    def job(procs: list) -> int:
        procs += start_serving(model_dir, tp, port, knobs, logs / "server", cuda_graphs, num_blocks, device)
        return patchbay_main(["ab", "--url", f"http://127.0.0.1:{port}", "--model", model_dir, *ab_args])

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


COUNT_PROMPT = "Count upwards from 1, one number per line, and do not stop."


class _Started:
    """Set once `total` streams have each received their first token."""

    def __init__(self, total: int):
        self.total, self.seen, self.lock, self.event = total, 0, threading.Lock(), threading.Event()

    def first_token(self) -> None:
        with self.lock:
            self.seen += 1
            if self.seen >= self.total:
                self.event.set()


def stream_reply(url: str, model: str, max_tokens: int, started: _Started, errors: list) -> None:
    """One greedy streamed chat reply, read to its end."""
    import httpx

    body = {"model": model, "messages": [{"role": "user", "content": COUNT_PROMPT}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    first = True
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:200]!r}")
            for line in r.iter_lines():
                if first and line.startswith("data: ") and line != "data: [DONE]":
                    first = False
                    started.first_token()
    except Exception as e:  # reported by the caller, which must not hang on a failed stream
        errors.append(f"{type(e).__name__}: {e}")
        if first:
            started.first_token()


def profile_levels(procs: list, url: str, model: str, levels: list[int], tokens: int, window_s: float,
                   ranks: list[Path]) -> list[dict]:
    """For each level: C streams of `tokens` tokens; once every stream has its first token, each
    served process (started under `patchbay.served_profile`, writing its windows into ranks[r])
    is profiled for `window_s` seconds."""
    rows = []
    for level in levels:
        started, errors = _Started(level), []
        threads = [threading.Thread(target=stream_reply, args=(url, model, tokens, started, errors))
                   for _ in range(level)]
        for t in threads:
            t.start()
        if not started.event.wait(300):
            raise RuntimeError(f"C{level}: not every stream got a first token in 300 s")
        if errors:
            raise RuntimeError(f"C{level}: {errors[0]}")
        before = [len(list(d.glob("window-*.json"))) for d in ranks]
        for proc in procs:
            os.kill(proc.pid, signal.SIGUSR1)
        _wait_for([d / f"started-{n}" for d, n in zip(ranks, before)], f"C{level}: a rank's profiler did not start")
        time.sleep(window_s)
        for proc in procs:
            os.kill(proc.pid, signal.SIGUSR2)
        windows = [d / f"window-{n}.json" for d, n in zip(ranks, before)]
        _wait_for(windows, f"C{level}: a rank wrote no profile window")
        rows += [{"level": level, "rank": rank, **json.loads(path.read_text())} for rank, path in enumerate(windows)]
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"C{level}: {errors[0]}")
    return rows


def _wait_for(paths: list[Path], failure: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.is_file() for p in paths):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{failure} within {timeout:.0f} s")
        time.sleep(0.1)


def render_served(rows: list[dict]) -> str:
    """The profiled windows as a decode-step table (ms a step; a step = one CUDA-graph replay)."""
    from .gpu_profile import STEP_HEADER, step_table_row

    lines = ["| level, rank | wall | GPU busy " + STEP_HEADER, "|---|" + "---:|" * 10]
    for row in rows:
        label = f"C{row['level']}, rank {row['rank']}"
        if row.get("wall_ms_per_step") is None:
            lines.append(f"| {label} | no CUDA-graph replays in the window (no GPU, or graphs off) |" + " |" * 9)
        else:
            lines.append(step_table_row(label, row))
    return "\n".join(lines) + "\n"


def served_profile_job(out: Path, levels: list[int], tokens: int, window_s: float, env: dict, cuda_graphs: bool,
                       num_blocks: int, model_dir: str | None, tp: int, port: int, device: str = "cuda") -> int:
    """Serve (air12 in memory, or MODEL_DIR as `tp` ranks), profile each level's decode steps on
    every rank, write out/served-profile.json and out/table.md."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def job(procs: list) -> int:
        procs += start_serving(model_dir, tp, port, env, out / "server", cuda_graphs, num_blocks, device,
                               profile_dir=out)
        ranks = [out / f"rank{r}" for r in range(len(procs))]
        rows.extend(profile_levels(procs, f"http://127.0.0.1:{port}", model_dir or AIR12, levels, tokens, window_s,
                                   ranks))
        return 0

    if with_servers(job):
        return 1
    (out / "served-profile.json").write_text(json.dumps({"levels": levels, "tokens": tokens, "window_s": window_s,
                                                         "env": env, "tp": tp, "rows": rows}, indent=1) + "\n")
    table = render_served(rows)
    (out / "table.md").write_text(table)
    print(table, flush=True)
    return 0


def exact_job(out: Path) -> int:
    """Exactness item 1 on the GPU: the same requests to pristine upstream and to the patched build
    with every knob unset (each engine first on PYTHONPATH, as scripts/gpu-run.sh installs them)."""
    from . import exact

    rest = [p for p in os.environ.get("PYTHONPATH", "").split(":") if "pb-engine-" not in p]
    transcripts = {}
    for n, engine in enumerate(("upstream", "patched")):
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PB_")},
               "PYTHONPATH": ":".join([f"/tmp/pb-engine-{engine}", *rest])}

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
    from . import gpu_agent
    from .cli import main as patchbay_main

    out.mkdir(parents=True, exist_ok=True)
    part = ("cuda-graphs" if cuda_graphs else "no-graphs") + ("+graph-sampling" if graph_sampling else "")
    results = {}

    def job(url):
        results[part] = gpu_agent.checks(url, AIR12, cuda_graphs, graph_sampling)
        if cuda_graphs or not ab_args:
            return 0
        off = json.dumps({k: 0 for k in gpu_agent.PATH_KNOBS})
        on = json.dumps({k: 1 for k in gpu_agent.PATH_KNOBS})
        return patchbay_main(["ab", "--url", url, "--model", AIR12, "--a-json", off, "--b-json", on,
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

    from . import roofline, windows
    from .synth import air12_config

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
        lines += [f"Exactness on the GPU (`python -m patchbay.gpu exact`): the same requests to pristine upstream "
                  f"and to the patched build with every knob unset gave {len(diffs)} differing responses "
                  f"(`exact.json`).", ""]
    lines += ["Aggregate tok/s is completion tokens over each pass's wall time (the mean of the two arms of an "
              "A/A run, both arms sending the same request); per-stream decode tok/s counts tokens after the "
              "first; the roofline is the H200's 4.16 TB/s over the bf16 weight bytes one step reads "
              "(`patchbay.roofline`).", "",
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


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m patchbay.gpu")
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("serve", help="serve synthetic:air12 until interrupted")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--cuda-graphs", action="store_true", help="upstream's --cb-use-cuda-graph")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--compile", action="store_true", help="upstream's --compile (sequential path, no batching)")
    s.add_argument("--num-blocks", type=int, help="KV cache pages of 256 tokens (default: upstream's, from free memory)")
    b = sub.add_parser("ab", help="serve air12, run `patchbay ab` against it, stop (ab's own flags follow --)")
    b.add_argument("--port", type=int, default=8000)
    b.add_argument("--cuda-graphs", action="store_true")
    b.add_argument("--compile", action="store_true")
    b.add_argument("--a-env", metavar="JSON", help="arm A is a server started with these PB_* variables (a JSON "
                   "object, a knob set such as @prod, or @prod+JSON)")
    b.add_argument("--b-env", metavar="JSON", help="arm B is a second server, side by side, with these")
    b.add_argument("--num-blocks", type=int, default=192,
                   help="with --a-env/--b-env: each server's KV pages of 256 tokens (default: %(default)s)")
    b.add_argument("--logs", default="/tmp/pb-ab-logs", help="with --a-env/--b-env: the servers' logs")
    b.add_argument("--model-dir", help="serve this checkpoint (`patchbay synth air12 DIR`) instead of air12 in "
                   "memory: with --a-env/--b-env as --a-tp / --b-tp ranks, alone as one server of --a-tp ranks "
                   "with the production knobs (ab's arms then per-request knobs, or --b-url to itself)")
    b.add_argument("--a-tp", type=int, default=1)
    b.add_argument("--b-tp", type=int, default=1)
    b.add_argument("--score", metavar="DIR", help="with --a-env/--b-env: then teacher-forced |Δ logprob| through "
                   "both servers into DIR (both envs need PB_FORCED_DECODING=1)")
    b.add_argument("ab_args", nargs=argparse.REMAINDER)
    x = sub.add_parser("exact", help="HTTP transcripts of air12: pristine upstream vs the patched build, knobs unset")
    x.add_argument("--out", required=True)
    g = sub.add_parser("agent", help="the agent API's device checks on air12 (and, without graphs, its cost)")
    g.add_argument("--out", required=True)
    g.add_argument("--cuda-graphs", action="store_true")
    g.add_argument("--graph-sampling", action="store_true", help="PB_GRAPH_SAMPLING=1 (0210)")
    g.add_argument("ab_args", nargs=argparse.REMAINDER, help="`patchbay ab` flags for the cost A/B (after --)")
    f = sub.add_parser("served-profile", help="profile the decode steps of a live server (every TP rank) "
                       "under load, collectives included")
    f.add_argument("--out", required=True)
    f.add_argument("--port", type=int, default=8000)
    f.add_argument("--cuda-graphs", action="store_true")
    f.add_argument("--env", default="{}", metavar="JSON", help="the server's PB_* variables")
    f.add_argument("--num-blocks", type=int, default=192)
    f.add_argument("--model-dir", help="serve this checkpoint as --tp ranks (default: air12 in memory, one rank)")
    f.add_argument("--tp", type=int, default=1)
    f.add_argument("--levels", default="1,8,32")
    f.add_argument("--tokens", type=int, default=1024, help="each stream's reply length (longer than the window)")
    f.add_argument("--window-s", type=float, default=1.0, help="seconds profiled at each level")
    w = sub.add_parser("wheels", help="gather the carried wheels into a folder (run here, not there)")
    w.add_argument("dest", nargs="?", default=str(ROOT / ".whl"))
    args = p.parse_args(argv)
    if args.verb == "wheels":
        from . import build, series

        loaded, problems = series.load()
        if problems:
            print("\n".join(map(str, problems)), file=sys.stderr)
            return 1
        engines = [build.build(None).wheel, build.build(loaded).wheel]
        for wheel in gather_wheels(Path(args.dest), engines):
            print(wheel.name)
        return 0
    if args.verb == "ab":
        from .cli import main as patchbay_main

        ab_args = [a for a in args.ab_args if a != "--"]
        if args.a_env is not None or args.b_env is not None:
            if args.a_env is None or args.b_env is None:
                raise SystemExit("--a-env needs --b-env")
            envs = [parse_env(args.a_env, "--a-env"), parse_env(args.b_env, "--b-env")]
            if (args.a_tp, args.b_tp) != (1, 1) and not args.model_dir:
                raise SystemExit("--a-tp/--b-tp need --model-dir: tensor-parallel ranks load a checkpoint")
            return side_by_side(args.cuda_graphs, args.port, envs, args.num_blocks, Path(args.logs), ab_args,
                                args.model_dir, (args.a_tp, args.b_tp),
                                score=Path(args.score) if args.score else None)
        if args.model_dir:  # one server of the checkpoint; ab's arms are per-request knobs (or --b-url)
            return checkpoint_ab(args.model_dir, args.a_tp, args.port, args.cuda_graphs, args.num_blocks,
                                 Path(args.logs), ab_args)
        return with_server(args.cuda_graphs, args.port,
                           lambda url: patchbay_main(["ab", "--url", url, "--model", AIR12, *ab_args]),
                           compile=args.compile)
    if args.verb == "exact":
        return exact_job(Path(args.out))
    if args.verb == "served-profile":
        if args.tp != 1 and not args.model_dir:
            raise SystemExit("--tp needs --model-dir: tensor-parallel ranks load a checkpoint")
        from .cli import Fail
        from .measure_cli import _int_list

        try:
            levels = _int_list(args.levels, "--levels")  # as `patchbay ab --concurrency` reads its levels
        except Fail as e:
            raise SystemExit(str(e)) from None
        return served_profile_job(Path(args.out), levels, args.tokens, args.window_s, parse_env(args.env, "--env"),
                                  args.cuda_graphs, args.num_blocks, args.model_dir, args.tp, args.port)
    if args.verb == "agent":
        return agent_job(Path(args.out), args.cuda_graphs, [a for a in args.ab_args if a != "--"],
                         args.graph_sampling)
    serve = serve_air12(args.port, args.cuda_graphs, args.seed, compile=args.compile, num_blocks=args.num_blocks)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set():
            stop.wait(1.0)
    except KeyboardInterrupt:
        pass
    serve.kill_server()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

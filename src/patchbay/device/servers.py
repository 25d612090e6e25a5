"""Servers on the GPU machine: `synthetic:air12` built in memory and served in this process
(`python -m patchbay.device serve --port P [--cuda-graphs]`), or a checkpoint served as
tensor-parallel ranks, each started in its own process and ready once it streamed a token.

air12 is built on the GPU from its seed (54 GB of bf16, about a second; no files) and served
with the engine on PYTHONPATH through `transformers serve`'s own handlers: the serve command is
constructed exactly as its CLI does, without a model, and the in-memory model is then
registered as the one model it serves (upstream loads models by path only).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..runtime import load_hooks

AIR12 = "synthetic:air12"
AIR12_FP8 = "synthetic:air12-fp8"
AIR_FP8 = "synthetic:air-fp8"
# What `serve` builds in memory: air12 (bf16, 54 GB); air12 quantized to FP8 (the same seeded
# weights, 128 x 128 blocks: runtime/fp8.py); GLM-4.5-Air's full geometry in FP8, built a layer at
# a time (about 108 GB). The FP8 ones are served with PB_FP8_WEIGHTS=1 (0810 computes them).
MODELS = (AIR12, AIR12_FP8, AIR_FP8)


def build_model(name: str, seed: int = 0):
    """One of MODELS on the GPU, from its seed."""
    from ..runtime import fp8
    from ..runtime.synth import build_air12

    if name not in MODELS:
        raise ValueError(f"{name}: not one of {', '.join(MODELS)}")
    if name == AIR_FP8:
        return fp8.build_air_fp8("cuda", seed=seed)
    model = build_air12("cuda", seed=seed)
    if name == AIR12_FP8:
        fp8.convert_model(model)
    return model


def serve_air12(port: int, cuda_graphs: bool, seed: int = 0, host: str = "127.0.0.1", compile: bool = False,
                num_blocks: int | None = None, model_name: str = AIR12):
    """Start the engine's server in this process with `model_name` (one of MODELS, air12 unless
    said) registered under that name; returns the Serve object."""
    import torch
    from transformers.cli.serve import Serve
    from transformers.cli.serving.model_manager import TimedModel

    from ..runtime.synth import padded_tokenizer

    if model_name != AIR12 and os.environ.get("PB_FP8_WEIGHTS", "0") in ("", "0"):
        raise SystemExit(f"{model_name} is served with PB_FP8_WEIGHTS=1: its products are 0810's")
    # Upstream's batching logger says which CUDA-graph paths it chose; keep that in the log.
    logging.getLogger("ContinuousBatchingLogger").setLevel(logging.INFO)
    t0 = time.monotonic()
    model = build_model(model_name, seed)
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
    print(f"{model_name} built on {torch.cuda.get_device_name()} in {time.monotonic() - t0:.1f}s, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB, experts={model.config._experts_implementation}, "
          f"attn={model.config._attn_implementation}", flush=True)
    # --compile reaches only upstream's sequential path (static cache + torch.compile), not its batching.
    serve = Serve(force_model=None, continuous_batching=not compile, cb_use_cuda_graph=cuda_graphs or None,
                  compile=compile, host=host, port=port, device="cuda", log_level="info", non_blocking=True,
                  cb_num_blocks=num_blocks)
    manager = serve._model_manager
    manager.model_timeout = -1
    manager.loaded_models[f"{model_name}@main"] = TimedModel(model, timeout_seconds=-1, processor=tokenizer)
    manager.force_model = model_name
    return serve


def serve_forever(port: int, cuda_graphs: bool, seed: int = 0, compile: bool = False,
                  num_blocks: int | None = None, model_name: str = AIR12) -> int:
    """`serve`: `model_name` (air12 unless said) in this process until SIGTERM or an interrupt."""
    serve = serve_air12(port, cuda_graphs, seed, compile=compile, num_blocks=num_blocks, model_name=model_name)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set():
            stop.wait(1.0)
    except KeyboardInterrupt:
        pass
    serve.kill_server()
    return 0


def profiled(cmd: list[str], profile_dir: Path | None) -> list[str]:
    """`python -m MODULE ARGS` run under served_profile's profiler (`python -m patchbay.device
    profiled`, windows into profile_dir)."""
    if profile_dir is None:
        return cmd
    assert cmd[1] == "-m", cmd
    return [cmd[0], "-m", "patchbay.device", "profiled", str(profile_dir), "--", *cmd[2:]]


def start_server(cuda_graphs: bool, port: int, log: Path, env: dict | None = None, compile: bool = False,
                 ready_timeout: float = 900.0, num_blocks: int | None = None,
                 profile_dir: Path | None = None, model_name: str = AIR12) -> subprocess.Popen:
    """`serve` in its own process (the load generator must not share its interpreter), returned
    once it has streamed a token; RuntimeError with the log's tail when it exits or never gets there."""
    cmd = [sys.executable, "-m", "patchbay.device", "serve", "--port", str(port), "--model", model_name]
    cmd += (["--cuda-graphs"] if cuda_graphs else []) + (["--compile"] if compile else [])
    cmd += ["--num-blocks", str(num_blocks)] if num_blocks else []
    cmd = profiled(cmd, profile_dir)
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    seconds = wait_ready([proc], [log], f"http://127.0.0.1:{port}", model_name, ready_timeout)
    print(f"ready in {seconds:.0f}s (cuda graphs {'on' if cuda_graphs else 'off'}"
          f"{', compile, no batching' if compile else ''})", flush=True)
    return proc


def wait_ready(procs: list, logs: list[Path], url: str, model: str, ready_timeout: float) -> float:
    """Seconds until the server at `url` streams a token. When one of its processes exits first
    or the time runs out, every process is stopped and RuntimeError carries that log's tail."""
    from ..runtime.launch import first_streamed_token, log_tail

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
    served_profile's profiler with its windows in profile_dir/rank{r}."""
    import dataclasses

    from ..runtime.config import Config
    from ..runtime.launch import engine_command, rank_env

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


def engine_path(site: str) -> str:
    """This process's PYTHONPATH with `site` as the engine: the engines scripts/gpu-run.sh installs
    (/tmp/pb-engine-*) left out, `site` first (another build's install folder, say)."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and "pb-engine-" not in p]
    return os.pathsep.join([site, *rest])


def start_serving(model_dir: str | None, tp: int, port: int, env: dict, logs: Path, cuda_graphs: bool,
                  num_blocks: int, device: str = "cuda", rdzv_port: int = 29600,
                  profile_dir: Path | None = None, model_name: str = AIR12) -> list:
    """`model_name` (air12 unless said) built in memory as one process (no `model_dir`; its log is
    logs.log), or `model_dir` as `tp` ranks (their logs in logs/). With `profile_dir`, rank r runs
    under served_profile's profiler with its windows in profile_dir/rank{r}."""
    if model_dir is None:
        base = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}
        return [start_server(cuda_graphs, port, logs.with_suffix(".log"), {**base, **env}, num_blocks=num_blocks,
                             profile_dir=profile_dir / "rank0" if profile_dir else None, model_name=model_name)]
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
                env: dict | None = None, compile: bool = False, num_blocks: int | None = None,
                model_name: str = AIR12) -> int:
    """Start `serve` of `model_name` (a KV pool of `num_blocks` pages, or upstream's from the memory
    left), run job(url), stop the server. Returns job's exit code."""
    log = log or Path(f"/tmp/pb-air12-{port}.log")
    try:
        proc = start_server(cuda_graphs, port, log, env, compile, ready_timeout, num_blocks=num_blocks,
                            model_name=model_name)
    except RuntimeError as e:
        print(e, flush=True)
        return 1
    try:
        return job(f"http://127.0.0.1:{port}")
    finally:
        stop_server(proc)

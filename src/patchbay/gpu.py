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
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import ROOT

AIR12 = "synthetic:air12"
# What the device image lacks for `transformers serve` (its torch, numpy, tokenizers, safetensors,
# huggingface_hub, httpx and typer do), pinned like pyproject.toml's engine extra.
CARRIED = ["fastapi==0.165.0", "starlette==1.10.0", "uvicorn==0.54.0", "pydantic==2.14.4",
           "pydantic_core==2.50.5", "annotated-types==0.8.0", "typing-inspection==0.4.5",
           "openai==3.57.0", "jiter==0.19.0", "distro==1.9.0", "sniffio==1.3.1"]
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


def serve_air12(port: int, cuda_graphs: bool, seed: int = 0, host: str = "127.0.0.1"):
    """Start the engine's server in this process with air12 registered; returns the Serve object."""
    import torch
    from transformers.cli.serve import Serve
    from transformers.cli.serving.model_manager import TimedModel

    from .synth import build_air12, padded_tokenizer

    t0 = time.monotonic()
    model = build_air12("cuda", seed=seed)
    tokenizer = padded_tokenizer(model.config.vocab_size)
    torch.cuda.synchronize()
    print(f"air12 built on {torch.cuda.get_device_name()} in {time.monotonic() - t0:.1f}s, "
          f"experts={model.config._experts_implementation}, attn={model.config._attn_implementation}", flush=True)
    serve = Serve(force_model=None, continuous_batching=True, cb_use_cuda_graph=cuda_graphs or None,
                  host=host, port=port, device="cuda", log_level="info", non_blocking=True)
    manager = serve._model_manager
    manager.model_timeout = -1
    manager.loaded_models[f"{AIR12}@main"] = TimedModel(model, timeout_seconds=-1, processor=tokenizer)
    manager.force_model = AIR12
    return serve


def with_server(cuda_graphs: bool, port: int, job, ready_timeout: float = 900.0, log: Path | None = None) -> int:
    """Start `serve` in its own process (the load generator must not share its interpreter),
    wait for a streamed token, run job(url), stop the server. Returns job's exit code."""
    from .launch import first_streamed_token, log_tail

    log = log or Path(f"/tmp/pb-air12-{port}.log")
    cmd = [sys.executable, "-m", "patchbay.gpu", "serve", "--port", str(port)] + (["--cuda-graphs"] if cuda_graphs else [])
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    try:
        while not first_streamed_token(url, AIR12):
            if proc.poll() is not None:
                print(f"server exited with {proc.returncode}:\n{log_tail(log, 40)}", flush=True)
                return 1
            if time.monotonic() - t0 > ready_timeout:
                print(f"server not ready in {ready_timeout:.0f}s:\n{log_tail(log, 40)}", flush=True)
                return 1
            time.sleep(2)
        print(f"ready in {time.monotonic() - t0:.0f}s (cuda graphs {'on' if cuda_graphs else 'off'})", flush=True)
        return job(url)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m patchbay.gpu")
    sub = p.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("serve", help="serve synthetic:air12 until interrupted")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--cuda-graphs", action="store_true", help="upstream's --cb-use-cuda-graph")
    s.add_argument("--seed", type=int, default=0)
    b = sub.add_parser("ab", help="serve air12, run `patchbay ab` against it, stop (ab's own flags follow --)")
    b.add_argument("--port", type=int, default=8000)
    b.add_argument("--cuda-graphs", action="store_true")
    b.add_argument("ab_args", nargs=argparse.REMAINDER)
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
        return with_server(args.cuda_graphs, args.port,
                           lambda url: patchbay_main(["ab", "--url", url, "--model", AIR12, *ab_args]))
    serve = serve_air12(args.port, args.cuda_graphs, args.seed)
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

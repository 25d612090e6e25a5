"""One synthetic:air12 MoE layer's experts on the GPU: upstream's implementations against the
fused Triton forward of patch 0220, timed at decode batch sizes, checked against eager, and
set against the HBM roofline of the expert bytes a step must read.

    python -m patchbay.device moe --out DIR [--graphs] [--tiles SPEC,...]   (on the GPU machine,
                                                                          through scripts/gpu-run.sh)
    python -m patchbay.device moe table DIR/moe.json                        (its Markdown table)

Without --graphs each forward is launched eagerly (launch overhead included, as W03 measured).
With --graphs each forward is captured once in a CUDA graph and the graph is replayed, as the
serving engine runs a decode step: what is left is the kernels' own time. --tiles sweeps the
fused kernels' launch shapes, each SPEC `BNxBKwWARPSsSTAGES/BNxBKwWARPSsSTAGES` (gate_up/down),
e.g. `16x256w4s4/32x128w4s4`, with `+tma` the weights read through 0430's TMA descriptors
(`32x64w4s4/32x64w4s4+tma`); `shipped` is DECODE_TILES (and grouped_mm above FUSED_MAX_PAIRS).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HBM_BYTES_S = 4.16e12  # measured H200 read bandwidth (DESIGN.md)
UPSTREAM = ("eager", "grouped_mm", "batched_mm")
_SPEC = re.compile(r"(\d+)x(\d+)w(\d+)s(\d+)")


def parse_tiles(text: str):
    """`16x256w4s4/32x128w4s4` -> ((Tiles, Tiles), False); a `+tma` suffix -> True (the decode
    launch reads the weights through 0430's TMA descriptors); `shipped` -> (None, False) (what the
    engine runs)."""
    from transformers._pb.ops.fused_moe import Tiles

    if text == "shipped":
        return None, False
    spec, tma = (text[:-4], True) if text.endswith("+tma") else (text, False)
    halves = spec.split("/")
    if len(halves) != 2 or not all(_SPEC.fullmatch(h) for h in halves):
        raise SystemExit(f"--tiles {text!r}: expected BNxBKwWARPSsSTAGES/BNxBKwWARPSsSTAGES[+tma] or shipped")
    return tuple(Tiles(*map(int, _SPEC.fullmatch(h).groups())) for h in halves), tma


def _time(fn, iters: int, graphs: bool) -> float:
    """Seconds per call: eager launches, or replays of one captured CUDA graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    run = fn
    if graphs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
        run()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        run()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000 / iters


def table_verb(argv: list[str], verb: str, render) -> int:
    """`python -m patchbay.device VERB table FILE`: print a job's JSON result as render makes it."""
    if len(argv) != 2:
        raise SystemExit(f"usage: python -m patchbay.device {verb} table {verb.upper()}_JSON")
    sys.stdout.write(render(json.loads(Path(argv[1]).read_text())))
    return 0


def render(result: dict) -> str:
    """moe.json as a Markdown table: microseconds per layer (and share of the roofline) for
    each implementation and tile shape, one column per token count."""
    rows = result["rows"]
    labels = list(dict.fromkeys(label for row in rows for label in row["impl"]))
    head = "| implementation | " + " | ".join(f"{row['tokens']} tok" for row in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows),
             "| roofline | " + " | ".join(f"{row['roofline_us']:.0f}" for row in rows) + " |"]
    for label in labels:
        cells = []
        for row in rows:
            entry = row["impl"].get(label)
            if entry is None:
                cells.append("-")
            elif "error" in entry:
                cells.append("error")
            elif label.startswith("align"):
                cells.append(f"{entry['us']:.1f}")
            else:
                cells.append(f"{entry['us']:.0f} ({entry['of_roofline']:.2f})")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        return table_verb(argv, "moe", render)
    p = argparse.ArgumentParser(prog="python -m patchbay.device moe")
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", default="1,8,32")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--graphs", action="store_true", help="time replays of a captured CUDA graph")
    p.add_argument("--tiles", default="shipped", help="comma-separated launch shapes of the fused kernels")
    p.add_argument("--impls", default=",".join(UPSTREAM), help="upstream implementations to time")
    args = p.parse_args(argv)
    import torch
    from transformers._pb.ops import fused_moe
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeExperts

    from ..runtime.synth import air12_config

    sweep = {spec: parse_tiles(spec) for spec in args.tiles.split(",")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    config = air12_config()
    torch.manual_seed(0)
    with torch.device("cuda"):
        module = Glm4MoeExperts(config).to(torch.bfloat16)
        with torch.no_grad():
            module.gate_up_proj.normal_(0, 0.02)
            module.down_proj.normal_(0, 0.02)
    fused_moe.register()
    experts, top_k = config.n_routed_experts, config.num_experts_per_tok
    per_expert_bytes = (module.gate_up_proj[0].numel() + module.down_proj[0].numel()) * 2
    arms = [(impl, impl, (None, False)) for impl in args.impls.split(",") if impl]
    arms += [(f"{fused_moe.NAME}:{spec}", fused_moe.NAME, parsed) for spec, parsed in sweep.items()]
    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        x = torch.randn(tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16)
        index = torch.stack([torch.randperm(experts, device="cuda")[:top_k] for _ in range(tokens)])
        weights = torch.rand(tokens, top_k, device="cuda", dtype=torch.bfloat16)
        touched = int(index.unique().numel())
        roofline_s = touched * per_expert_bytes / HBM_BYTES_S
        results = {}
        with torch.no_grad():
            module.config._experts_implementation = "eager"
            reference = module(x, index, weights).float()
            for label, impl, (tiles, tma) in arms:
                module.config._experts_implementation = impl
                fused_moe.TILES_OVERRIDE, fused_moe.DECODE_TMA = tiles, tma
                try:
                    y = module(x, index, weights)
                    seconds = _time(lambda: module(x, index, weights), args.iters, args.graphs)
                    diff = (y.float() - reference).abs().max().item() / max(reference.abs().max().item(), 1e-9)
                    results[label] = {"us": seconds * 1e6, "of_roofline": roofline_s / seconds, "rel_max_diff": diff}
                except Exception as e:  # an implementation that cannot run this shape is recorded, not fatal
                    results[label] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                finally:
                    fused_moe.TILES_OVERRIDE, fused_moe.DECODE_TMA = None, False
            n_pairs = tokens * top_k
            if n_pairs <= fused_moe.ALIGN_CHUNK_PAIRS:  # the sort into blocks alone: Triton's vs torch ops
                try:
                    same = all(torch.equal(a, b) for a, b in zip(fused_moe.align(index, experts),
                                                                 fused_moe.align_torch(index, experts)))
                    for label, fn in (("align:triton", fused_moe.align), ("align:torch", fused_moe.align_torch)):
                        results[label] = {"us": _time(lambda: fn(index, experts), args.iters, args.graphs) * 1e6,
                                          "equal": same}
                except Exception as e:
                    results["align"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        row = {"tokens": tokens, "experts_touched": touched, "roofline_us": roofline_s * 1e6, "impl": results}
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"device": torch.cuda.get_device_name(), "graphs": args.graphs, "iters": args.iters, "rows": rows}
    (out / "moe.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0

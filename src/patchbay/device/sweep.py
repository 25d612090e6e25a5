"""`python -m patchbay.device sweep`: the engine's own kernels at synthetic:air12's shapes, their launch
tiles overridden one configuration at a time, bits against the engine's own choice.

- gemm: 0380's invariant GEMM (invariant_gemm.gemm) on every dense product of a layer, TP=1 and
  TP=2 shards, at --rows rows; the pointer path's tile (invariant_gemm.tiles) or, with --tma,
  0410's TMA tile (tma_tiles); cuBLAS (F.linear) timed beside it. W13 tune4, W14 tune6. At decode
  sizes (up to CHUNK_MAX_ROWS rows) each is timed in CUDA graph replays over copies of the weight
  past L2 (sweep.graph_ms), as a decode step runs it; above, between events.
- fp8: 0810's float8 GEMM (invariant_gemm.gemm_fp8) on GLM-4.5-Air's dense products quantized in
  128 x 128 blocks, at --rows rows (decode sizes): the launch tile (weight rows, warps, stages), the
  programs a one-row product is cut into (FP8_MIN_PROGRAMS: the K chunks, which fix the sums' order)
  and the depth, in CUDA graph replays over copies of the weight past L2 (--row-tile: the
  activation rows a program, else the engine's). Other chunks give other (equally row-invariant)
  bits, and so do tiles under the tensor core's 64-row warp-group instruction (32 weight rows, or 2
  warps: another MMA, whose bits differ from the larger steps' tiles, W76), so the best of all rows
  is reported beside the best that keeps the engine's bits. --experts adds one air12 MoE layer's
  routed experts in float8 (0220's kernels take the same tile and depth; K is not chunked there).
- moe: 0390's large-step MoE kernels (fused_moe.experts_forward with moe_one_path on) on a
  --tokens-token step, each kernel's tile in turn against the engine's other, pointer and TMA
  weight reads (0430). W14 tune7.

All need CUDA and the patched engine (scripts/gpu-run.sh patched).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from ..measure.tools import record, sweep

# (name, N, K, has bias) of air12's dense products: TP=1, and TP=2's shard of each
GEMMS = {"1": [("qkv+bias", 14336, 4096, True), ("o_proj", 4096, 12288, False), ("shared_gate_up", 2816, 4096, False),
               ("shared_down", 4096, 1408, False), ("dense_gate_up", 21888, 4096, False),
               ("dense_down", 4096, 10944, False)],
         "2": [("qkv+bias", 7168, 4096, True), ("o_proj", 4096, 6144, False), ("shared_gate_up", 1408, 4096, False),
               ("shared_down", 4096, 704, False), ("dense_gate_up", 10944, 4096, False),
               ("dense_down", 4096, 5472, False)]}
GEMM_TILES = "128x128x64w8s3,128x128x64w8s4,256x128x64w8s3,128x256x64w8s3,128x64x64w4s4,64x128x64w4s4,128x128x128w8s3"
FP8_TILES = "64w4s4,32w4s4,128w4s4,64w4s3,64w4s6,64w2s4,128w8s4"  # weight rows x warps x stages
FP8_PROGRAMS = "264,132,528,1056"
FP8_DEPTHS = "128,64"
MOE_INTER = {"1": 1408, "2": 704}  # an expert's width per shard
GATE_UP_TILES = "128x64w8s3,128x64w8s4,128x128w8s3,64x64w4s4,128x32w8s4"
DOWN_TILES = "256x64w8s4,128x64w8s4,256x64w8s3,128x128w8s3"


@contextlib.contextmanager
def overridden(module, **values):
    """module's attributes set to values inside the block, restored after."""
    saved = {name: getattr(module, name) for name in values}
    for name, value in values.items():
        setattr(module, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


def gemm(args, command: str) -> sweep.Results:
    import torch
    import torch.nn.functional as F
    from transformers._pb.ops import invariant_gemm as ig

    tiles = [ig.Tiles(*t) for t in sweep.parse_tiles(args.tiles, 5)]
    results = sweep.Results(args.out, "gemm", {"command": command, "rows": args.rows, "tma": args.tma,
                                               "device": torch.cuda.get_device_name()})
    path = "tma_tiles" if args.tma else "tiles"
    for tp in args.tp:
        for name, n, k, has_bias in GEMMS[tp]:
            gen = torch.Generator(device="cuda").manual_seed(n * 7 + k)
            w = (torch.randn((n, k), generator=gen, device="cuda") * 0.02).bfloat16()
            bias = (torch.randn((n,), generator=gen, device="cuda") * 0.02).bfloat16() if has_bias else None
            x = torch.randn((args.rows, k), generator=gen, device="cuda").bfloat16()
            # decode sizes: graph replays over copies of the weight, so each call reads it from HBM
            decode = args.rows <= ig.CHUNK_MAX_ROWS
            weights = [w] + [w.clone() for _ in range(sweep.copies_for(w.numel() * 2) - 1)] if decode else [w]
            with overridden(ig, TMA=args.tma):
                ref = ig.gemm(x, w.t(), bias)
                chunked = -(-k // ig.chunk_k(n, k)) > 1
                own = ig.tma_tiles(args.rows, n, chunked) if args.tma else ig.tiles(args.rows, x.dtype, chunked)

                def run(tile, i):
                    fixed = (lambda m, n_, c: tile) if args.tma else (lambda m, dtype, c: tile)
                    with overridden(ig, **{path: fixed}):
                        return ig.gemm(x, weights[i % len(weights)].t(), bias)

                rows = sweep.sweep(run, tiles, ref, "graph" if decode else "events")
            cublas = sweep.timer("graph" if decode else "events")(lambda i: F.linear(x, weights[i % len(weights)], bias))
            results.add({"tp": tp, "gemm": name, "n": n, "k": k, "chunked": chunked}, rows,
                        engine_tile=list(own) if own else None, cublas_ms=round(cublas, 5))
            del w, x, bias, weights
    return results


def moe(args, command: str) -> sweep.Results:
    import torch
    from transformers import Glm4MoeConfig
    from transformers._pb.ops import fused_moe, moe_one_path
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeExperts

    gate_ups, downs = sweep.parse_tiles(args.gate_up, 4), sweep.parse_tiles(args.down, 4)
    results = sweep.Results(args.out, "moe", {"command": command, "tokens": args.tokens,
                                              "device": torch.cuda.get_device_name()})
    own = moe_one_path.GATE_UP_TILES, moe_one_path.DOWN_TILES
    # one kernel's tile at a time against the engine's other
    configs = ([{"gate_up": g, "down": own[1], "tma": t} for g in gate_ups for t in (False, True)]
               + [{"gate_up": own[0], "down": d, "tma": t} for d in downs if d != own[1] for t in (False, True)])
    for tp in args.tp:
        config = Glm4MoeConfig(hidden_size=4096, moe_intermediate_size=MOE_INTER[tp], n_routed_experts=128,
                               num_experts_per_tok=8)
        torch.manual_seed(0)
        experts = Glm4MoeExperts(config).cuda().bfloat16()
        with torch.no_grad():
            experts.gate_up_proj.normal_(0, 0.02)
            experts.down_proj.normal_(0, 0.02)
        x = torch.randn(args.tokens, 4096, device="cuda").bfloat16()
        index = torch.rand(args.tokens, 128, device="cuda").topk(8, dim=1).indices
        weights = torch.rand(args.tokens, 8, device="cuda")

        def run(cfg, _i):
            with overridden(moe_one_path, ENABLED=True, TMA=cfg["tma"], GATE_UP_TILES=cfg["gate_up"],
                            DOWN_TILES=cfg["down"]), torch.no_grad():
                return fused_moe.experts_forward(experts, x, index, weights)

        ref = run({"tma": False, "gate_up": own[0], "down": own[1]}, 0)
        rows = sweep.sweep(run, configs, ref, "events")
        results.add({"tp": tp, "inter": MOE_INTER[tp], "tokens": args.tokens}, rows,
                    engine_tiles={"gate_up": own[0], "down": own[1]})
        del experts, x
        torch.cuda.empty_cache()
    return results


def _chunks(ig, n: int, k: int) -> int:
    """The K chunks of an [n, k] float8 weight under invariant_gemm's settings now in force."""
    return -(-k // ig.fp8_chunk_k(n, k))


def _best_any(rows: list[dict]) -> dict | None:
    """The fastest configuration that ran, whatever its bits (other chunks give other bits)."""
    top = sweep.best(rows, same_bits=False)
    return None if top is None else {"cfg": top["cfg"], "ms": top["ms"]}


def fp8_configs(tiles: str, programs: str, depths: str) -> list[dict]:
    """The fp8 case's configurations: every tile at every program count at the first depth, then
    the other depths at the first tile and each program count."""
    tile_list = sweep.parse_tiles(tiles, 3)
    counts = [int(v) for v in programs.split(",") if v]
    depth_list = [int(v) for v in depths.split(",") if v]
    configs = [{"tile": list(t), "programs": p, "depth": depth_list[0]} for p in counts for t in tile_list]
    configs += [{"tile": list(tile_list[0]), "programs": p, "depth": d} for d in depth_list[1:] for p in counts]
    return configs


def fp8(args, command: str) -> sweep.Results:
    import torch
    from transformers._pb.ops import common
    from transformers._pb.ops import invariant_gemm as ig

    from ..runtime import fp8 as fp8_format
    from .gpu_fp8 import fp8_scales

    configs = fp8_configs(args.tiles, args.programs, args.depths)
    results = sweep.Results(args.out, "fp8", {"command": command, "rows": args.rows, "step_scale": args.step_scale,
                                              "device": torch.cuda.get_device_name()})
    common.FP8_STEP_SCALE = args.step_scale  # 0960 for every configuration, the engine's own included
    own_tiles, own_depth = ig.fp8_tiles, ig.fp8_depth
    row_tile = args.row_tile  # activation rows a program: 0 keeps the engine's (a row's bits do not depend on it)

    def settings(cfg):
        n_rows, warps, stages = cfg["tile"]
        depth = cfg["depth"]

        def tiles(m):
            t = own_tiles(m)
            return ig.Tiles(row_tile or t.m, n_rows, 0, warps, stages)

        def fixed_depth(scale_k, *starts):
            fits = scale_k % depth == 0 and all(start % depth == 0 for start in starts)
            return depth if fits else own_depth(scale_k, *starts)

        return {"fp8_tiles": tiles, "fp8_depth": fixed_depth, "FP8_MIN_PROGRAMS": cfg["programs"]}

    for name, n, k, has_bias in GEMMS["1"]:  # as 0310 serves them in FP8 too (q/k/v, gate/up stacked)
        gen = torch.Generator(device="cuda").manual_seed(n * 7 + k)
        w = (torch.randn((n, k), generator=gen, device="cuda") * 0.02).bfloat16()
        q, grid = fp8_format.quantize(w)
        del w
        scales = fp8_scales(grid, n, fp8_format.BLOCK, "cuda")
        bias = (torch.randn((n,), generator=gen, device="cuda") * 0.02).bfloat16() if has_bias else None
        x = torch.randn((args.rows, k), generator=gen, device="cuda").bfloat16()
        weights = [q] + [q.clone() for _ in range(sweep.copies_for(q.numel()) - 1)]
        ref = ig.gemm_fp8(x, q, *scales, bias=bias)
        own_chunks = _chunks(ig, n, k)

        def run(cfg, i):
            with overridden(ig, **settings(cfg)):
                return ig.gemm_fp8(x, weights[i % len(weights)], *scales, bias=bias)

        rows = sweep.sweep(run, configs, ref, "graph")
        for row in rows:
            with overridden(ig, **settings(row["cfg"])):
                row["chunks"] = _chunks(ig, n, k)
        results.add({"gemm": name, "n": n, "k": k, "rows": args.rows}, rows, engine_chunks=own_chunks,
                    best_any=_best_any(rows), weight_mb=round(q.numel() / 1e6, 2))
        del q, grid, x, bias, weights
        torch.cuda.empty_cache()
    if args.experts:
        experts_case(args, results, configs, settings)
    return results


def experts_case(args, results, configs: list[dict], settings) -> None:
    """The fp8 case's routed experts (0220's float8 kernels run the float8 GEMM's tile and depth):
    one air12 MoE layer at --rows tokens, distinct routes, timed in graph replays (the experts
    themselves are past L2)."""
    import torch
    from transformers._pb.ops import fused_moe, invariant_gemm as ig

    from ..runtime.synth import air12_config
    from .gpu_fp8 import _experts

    config = air12_config()
    quantized = _experts(config)[1]  # the dequantized twin is dropped here
    torch.cuda.empty_cache()
    gen = torch.Generator(device="cuda").manual_seed(args.rows)
    x = torch.randn((args.rows, config.hidden_size), generator=gen, device="cuda").bfloat16()
    index = torch.rand((args.rows, config.n_routed_experts), generator=gen, device="cuda").topk(
        config.num_experts_per_tok, dim=1).indices
    weights = torch.rand((args.rows, config.num_experts_per_tok), generator=gen, device="cuda").bfloat16()
    own = [c for c in configs if c["programs"] == configs[0]["programs"]]  # programs do not apply here

    def run(cfg, _i):
        with overridden(ig, **settings(cfg)), torch.no_grad():
            return fused_moe.experts_forward(quantized, x, index, weights)

    rows = sweep.sweep(run, own, run(own[0], 0), "graph")
    results.add({"gemm": "routed experts", "rows": args.rows, "experts_touched": int(index.unique().numel())}, rows,
                best_any=_best_any(rows))


CASES = {"gemm": gemm, "moe": moe, "fp8": fp8}


def shards(text: str) -> list[str]:
    out = text.split(",")
    if not out or any(tp not in GEMMS for tp in out):
        raise argparse.ArgumentTypeError(f"{text!r}: expected 1, 2 or 1,2")
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m patchbay.device sweep",
                                description="launch sweeps of the engine's kernels at air12's shapes")
    sub = p.add_subparsers(dest="case", required=True)
    g = sub.add_parser("gemm", help="0380/0410's GEMM tiles at a prompt's rows")
    g.add_argument("out", type=Path)
    g.add_argument("--rows", type=int, default=8192)
    g.add_argument("--tp", type=shards, default="1,2", help="the shards: 1, 2 or 1,2 (default: %(default)s)")
    g.add_argument("--tma", action="store_true", help="sweep 0410's TMA tile (else the pointer path's)")
    g.add_argument("--tiles", default=GEMM_TILES, help="MxNxKwWARPSsSTAGES,… (default: %(default)s)")
    f = sub.add_parser("fp8", help="0810's float8 GEMM launch at decode rows")
    f.add_argument("out", type=Path)
    f.add_argument("--rows", type=int, default=1)
    f.add_argument("--tiles", default=FP8_TILES, help="NwWARPSsSTAGES,… weight rows a program (default: %(default)s)")
    f.add_argument("--programs", default=FP8_PROGRAMS, help="FP8_MIN_PROGRAMS values (default: %(default)s)")
    f.add_argument("--depths", default=FP8_DEPTHS, help="BLOCK_K values (default: %(default)s)")
    f.add_argument("--experts", action="store_true", help="also the routed experts (tile and depth)")
    f.add_argument("--row-tile", type=int, default=0, help="activation rows a program (default: the engine's)")
    f.add_argument("--step-scale", action="store_true", help="0960's kernels: each step's sum scaled")
    m = sub.add_parser("moe", help="0390/0430's large-step MoE tiles")
    m.add_argument("out", type=Path)
    m.add_argument("--tokens", type=int, default=8192)
    m.add_argument("--tp", type=shards, default="1,2")
    m.add_argument("--gate-up", default=GATE_UP_TILES, help="BNxBKwWARPSsSTAGES,… (default: %(default)s)")
    m.add_argument("--down", default=DOWN_TILES)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    if not sweep.cuda():
        print(f"sweep: {args.case} needs a CUDA device and the patched engine (scripts/gpu-run.sh patched)",
              file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    line = record.write_command(args.out, "sweep", argv)
    try:
        results = CASES[args.case](args, line)
    except ValueError as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    for entry in results.data["cases"]:
        print(f"best {json.dumps(entry['case'])}: {entry['best']}")
    print(f"wrote {results.path}")
    return 0


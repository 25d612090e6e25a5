"""0810's FP8 products on the GPU at GLM-4.5-Air's shapes: each of a decoder layer's dense
products and its routed experts, quantized to 128 x 128 blocks, run by the series' kernels on
the float8 weights and on their dequantized twin (the same kernels, bf16 weights), and by cuBLAS
on the twin; each captured in a CUDA graph and replayed, timed against the HBM roofline of the
bytes it must read, and its FP8 result compared with the twin's (bits, and the largest
difference: the sums' order alone may differ, so a larger one fails the job).

    python -m patchbay.device fp8 --out DIR [--tokens 1,8,32,256] [--iters 50] [--step-scale]
                                              (on the GPU machine, through scripts/gpu-run.sh)
    python -m patchbay.device fp8 table DIR/fp8.json                 (its Markdown table)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .gpu_moe import HBM_BYTES_S, _time, table_verb

# An H100 (SXM) reads at most 3.35 TB/s (its data sheet; the H200's figure is measured).
H100_BYTES_S = 3.35e12

# A GLM-4.5-Air decoder layer's dense products at TP=1 as its checkpoint stores them:
# name -> (out features, in features)
DENSE = {"q_proj": (12288, 4096), "k_proj": (1024, 4096), "o_proj": (4096, 12288),
         "shared gate": (1408, 4096), "shared down": (4096, 1408),
         "dense gate": (10944, 4096), "dense down": (4096, 10944)}
# FP8 against the twin, relative to the twin's largest value: the sums' order only (bf16 outputs)
MAX_ERROR = 1e-2
# The CPU test runs this code under Triton's interpreter, in float32 (its bf16 rounding truncates).
DEVICE, DTYPE = "cuda", None  # None: torch.bfloat16, as served


class _Experts:
    """An experts module seen with other weights (and 0810's scale grids in `pb_fp8`)."""

    def __init__(self, source, **weights):
        self.__dict__.update(weights)
        self._source = source

    def __getattr__(self, name):
        return getattr(self._source, name)


def hbm_bytes_s(device_name: str) -> float:
    """The read bandwidth the rooflines use for this GPU."""
    return H100_BYTES_S if "H100" in device_name else HBM_BYTES_S


def _dtype():
    import torch

    return DTYPE or torch.bfloat16


def fp8_scales(grid, rows: int, block: tuple[int, int], device) -> tuple:
    """What 0810's kernels read to expand a whole (unsharded) weight of `rows` rows quantized in
    `block`s: the grid, its row for each weight row, the first column (0) and the columns a scale
    covers."""
    import torch

    return grid, (torch.arange(rows, device=device) // block[0]).to(torch.int32), 0, block[1]


def _time_arms(row: dict, arms: dict, read_bytes: dict, iters: int, bandwidth: float) -> dict:
    """Each arm's microseconds per replay of its CUDA graph, and the share of the roofline (its
    `read_bytes` at `bandwidth`) that is, into `row`."""
    for label, fn in arms.items():
        seconds = _time(fn, iters, graphs=True)
        row[label] = {"us": seconds * 1e6, "of_roofline": read_bytes[label] / bandwidth / seconds}
    return row


def _against_twin(fp8, twin) -> dict:
    """Whether the FP8 product gave the twin's bits, and its largest difference from it relative
    to the twin's largest magnitude."""
    import torch

    scale = twin.float().abs().max().item() or 1.0
    return {"equal": bool(torch.equal(fp8, twin)), "error": (fp8.float() - twin.float()).abs().max().item() / scale}


def dense_row(name: str, tokens: int, iters: int, bandwidth: float) -> dict:
    """One dense product at `tokens` rows: us per call and share of its roofline for the FP8
    kernel, the bf16 kernel on the twin and cuBLAS on the twin; whether FP8 == twin bitwise."""
    import torch
    import torch.nn.functional as F
    from transformers._pb.ops import invariant_gemm

    from ..runtime import fp8

    n, k = DENSE[name]
    gen = torch.Generator(device=DEVICE).manual_seed(n * 7 + k)
    w = torch.randn((n, k), generator=gen, device=DEVICE).mul_(0.02).to(_dtype())
    q, grid = fp8.quantize(w)
    twin = fp8.dequantize(q, grid, _dtype())
    scales = fp8_scales(grid, n, fp8.BLOCK, DEVICE)
    x = torch.randn((tokens, k), generator=gen, device=DEVICE).to(_dtype())
    arms = {"fp8 kernel": lambda: invariant_gemm.gemm_fp8(x, q, *scales),
            "bf16 kernel": lambda: invariant_gemm.gemm(x, twin.t()),
            "cuBLAS bf16": lambda: F.linear(x, twin)}
    weight_bytes = {"fp8 kernel": n * k + grid.numel() * 4, "bf16 kernel": 2 * n * k, "cuBLAS bf16": 2 * n * k}
    row = {"product": name, "tokens": tokens, **_against_twin(arms["fp8 kernel"](), arms["bf16 kernel"]())}
    read = {label: size + 2 * tokens * (n + k) for label, size in weight_bytes.items()}  # weight, input, output
    return _time_arms(row, arms, read, iters, bandwidth)


def experts_row(tokens: int, iters: int, module, quantized: dict, twin, bandwidth: float) -> dict:
    """The routed experts (0220's kernels) at `tokens` tokens, FP8 against the twin, as dense_row."""
    import torch
    from transformers._pb.ops import fused_moe

    config = module.config
    experts, top_k = config.n_routed_experts, config.num_experts_per_tok
    gen = torch.Generator(device=DEVICE).manual_seed(tokens)
    x = torch.randn((tokens, config.hidden_size), generator=gen, device=DEVICE).to(_dtype())
    index = torch.rand((tokens, experts), generator=gen, device=DEVICE).topk(top_k, dim=1).indices
    weights = torch.rand((tokens, top_k), generator=gen, device=DEVICE).to(_dtype())
    touched = int(index.unique().numel())
    per_expert = 3 * config.moe_intermediate_size * config.hidden_size  # gate, up, down
    arms = {"fp8 kernel": lambda: fused_moe.experts_forward(quantized, x, index, weights),
            "bf16 kernel": lambda: fused_moe.experts_forward(twin, x, index, weights)}
    row = {"product": "routed experts", "tokens": tokens, "experts_touched": touched,
           **_against_twin(arms["fp8 kernel"](), arms["bf16 kernel"]())}
    read = {"fp8 kernel": touched * per_expert, "bf16 kernel": 2 * touched * per_expert}
    return _time_arms(row, arms, read, iters, bandwidth)


def _experts(config):
    """Air's routed experts in bf16 (seeded), their FP8 form as 0810 hands it to 0220's kernels,
    and the dequantized twin."""
    import torch
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeExperts

    from ..runtime import fp8

    torch.manual_seed(0)
    with torch.device(DEVICE):
        module = Glm4MoeExperts(config).to(_dtype())
    with torch.no_grad():
        module.gate_up_proj.normal_(0, 0.02)
        module.down_proj.normal_(0, 0.02)
    weights, grids, twins = {}, {}, {}
    for name, short in (("gate_up_proj", "gate_up"), ("down_proj", "down")):
        q, grid = fp8.quantize(getattr(module, name).data)
        weights[name], grids[short] = q, fp8_scales(grid, q.shape[-2], fp8.BLOCK, DEVICE)
        twins[name] = torch.stack([fp8.dequantize(q[e], grid[e], _dtype()) for e in range(q.shape[0])])
        setattr(module, name, None)
    return module, _Experts(module, pb_fp8=grids, **weights), _Experts(module, **twins)


def render(result: dict) -> str:
    """fp8.json as a Markdown table: per product and token count, us (share of roofline) for
    each arm, FP8 over the bf16 kernel's time, whether FP8 gave the twin's bits and how far from
    them it is."""
    lines = ["| product | tokens | fp8 kernel | bf16 kernel | cuBLAS bf16 | bf16 / fp8 time | fp8 == twin | max diff |",
             "|---|---:|---:|---:|---:|---:|---|---:|"]
    for row in result["rows"]:
        cells = []
        for arm in ("fp8 kernel", "bf16 kernel", "cuBLAS bf16"):
            entry = row.get(arm)
            cells.append(f"{entry['us']:.1f} ({entry['of_roofline']:.2f})" if entry else "–")
        speed = row["bf16 kernel"]["us"] / row["fp8 kernel"]["us"]
        lines.append(f"| {row['product']} | {row['tokens']} | " + " | ".join(cells)
                     + f" | {speed:.2f} | {'yes' if row['equal'] else 'no'} | {row.get('error', 0.0):.1e} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv[:1] == ["table"]:
        return table_verb(argv, "fp8", render)
    p = argparse.ArgumentParser(prog="python -m patchbay.device fp8")
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", default="1,8,32,256")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--step-scale", action="store_true",
                   help="0960: the float8 kernels scale each step's sum instead of each weight element")
    args = p.parse_args(argv)
    import torch
    from transformers._pb.ops import common, moe_one_path

    from ..runtime.synth import air12_config

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    bandwidth = hbm_bytes_s(gpu)
    token_counts = [int(t) for t in args.tokens.split(",")]
    moe_one_path.ENABLED = True  # as the production set runs the experts
    common.FP8_STEP_SCALE = args.step_scale
    rows = []
    try:
        with torch.no_grad():
            for name in DENSE:
                for tokens in token_counts:
                    rows.append(dense_row(name, tokens, args.iters, bandwidth))
                    print(json.dumps(rows[-1]), flush=True)
            module, quantized, twin = _experts(air12_config())
            for tokens in token_counts:
                rows.append(experts_row(tokens, args.iters, module, quantized, twin, bandwidth))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        moe_one_path.restore()
        common.FP8_STEP_SCALE = False
    result = {"device": gpu, "bytes_s": bandwidth, "iters": args.iters, "step_scale": args.step_scale, "rows": rows}
    (out / "fp8.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "table.md").write_text(render(result))
    sys.stdout.write(render(result))
    # the FP8 products expand to the twin's values: apart from the order of their sums, the same
    return 0 if all(row["error"] <= MAX_ERROR for row in rows) else 1

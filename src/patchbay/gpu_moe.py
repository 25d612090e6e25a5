"""One synthetic:air12 MoE layer's experts on the GPU: upstream's implementations against the
fused Triton forward of patch 0220, timed with CUDA events at decode batch sizes, checked
against eager, and set against the HBM roofline of the expert bytes a step must read.

    python -m patchbay.gpu_moe --out DIR        (on the GPU machine, through scripts/gpu-run.sh)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HBM_BYTES_S = 4.16e12  # measured H200 read bandwidth (DESIGN.md)


def main(argv: list[str]) -> int:
    import torch
    from transformers._pb import fused_moe
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeExperts

    from .synth import air12_config

    p = argparse.ArgumentParser(prog="python -m patchbay.gpu_moe")
    p.add_argument("--out", required=True)
    p.add_argument("--tokens", default="1,8,32")
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args(argv)
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
            for impl in ("eager", "grouped_mm", "batched_mm", fused_moe.NAME):
                module.config._experts_implementation = impl
                try:
                    y = module(x, index, weights)
                    for _ in range(3):
                        module(x, index, weights)
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(args.iters):
                        module(x, index, weights)
                    end.record()
                    torch.cuda.synchronize()
                    seconds = start.elapsed_time(end) / 1000 / args.iters
                    diff = (y.float() - reference).abs().max().item() / max(reference.abs().max().item(), 1e-9)
                    results[impl] = {"us": seconds * 1e6, "of_roofline": roofline_s / seconds, "rel_max_diff": diff}
                except Exception as e:  # an implementation that cannot run this shape is recorded, not fatal
                    results[impl] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
        row = {"tokens": tokens, "experts_touched": touched, "roofline_us": roofline_s * 1e6, "impl": results}
        rows.append(row)
        print(json.dumps(row), flush=True)
    (out / "moe.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

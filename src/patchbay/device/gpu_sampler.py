"""`python -m patchbay.device sampler OUT`: the engine's two ways of choosing sampled rows on the GPU.

For 1 to 128 rows of GLM's vocabulary (151,552 logits), each row sampled with its own seed,
temperature 0.7, top_p 0.95 (what agents send) and, in a second setting, top_k 40 and min_p
0.05 too, and a mix of rows with and without cuts: the time a step spends choosing, 0100's
row-by-row `choose` against 0630's batched `choose_rows`, eager and with 0650's draw replayed
from CUDA graphs (the host's own waits included, median of reps), and graphed with 0660's
sort-free cuts; whether every row's token is the same chosen alone as among all the others
(batched), whether the graphs' tokens are the eager draw's, and how many sort-free tokens are
the sort's.
`--device cpu --vocab N` runs the same job small on a CPU (tests/device/test_gpu_sampler.py).
Writes OUT/sampler.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

VOCAB = 151_552
SETTINGS = {"temperature": {"temperature": 0.7}, "agent": {"temperature": 0.7, "top_p": 0.95},
            "all": {"temperature": 0.7, "top_p": 0.95, "top_k": 40, "min_p": 0.05},
            "mixed": None}  # every other row cuts nothing (0650's "mixed" graphs)


def _settings(name: str, row: int) -> dict:
    if SETTINGS[name] is not None:
        return SETTINGS[name]
    return SETTINGS["temperature"] if row % 2 else SETTINGS["agent"]


def run(rows_levels: list[int], reps: int, device: str = "cuda", vocab: int = VOCAB) -> dict:
    import torch

    from transformers._pb.runtime import batched_sampler, sampler

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    torch.manual_seed(0)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    out = {"device": name, "vocab": vocab, "levels": []}
    for name in SETTINGS:
        for rows in rows_levels:
            raw = (torch.randn(rows, vocab, device=device) * 3).float()

            def specs(position: int = 0, graphed: bool = False, sort_free: bool = False):
                made = []
                for r in range(rows):
                    s = sampler.Spec(do_sample=True, seed=1000 + r, **_settings(name, r))
                    s.position, s.graphed, s.sort_free = position, graphed, sort_free
                    made.append(s)
                return made

            def per_row():
                chosen = []
                for r, s in enumerate(specs()):
                    s.generator = torch.Generator(device="cpu")
                    s.generator.manual_seed(s.seed)
                    chosen.append(sampler.choose(s, raw[r]))
                return chosen

            def batched():
                return batched_sampler.choose_rows(specs(), raw, list(range(rows)))

            def graphed():
                return batched_sampler.choose_rows(specs(graphed=True), raw, list(range(rows)))

            def free():  # 0660 in 0650's graphs
                return batched_sampler.choose_rows(specs(graphed=True, sort_free=True), raw, list(range(rows)))

            timings = {}
            for label, fn in (("per_row", per_row), ("batched", batched), ("graphed", graphed), ("free", free)):
                fn()  # warm-up: kernels loaded, allocator primed
                samples = []
                for _ in range(reps):
                    sync()
                    t0 = time.perf_counter()
                    result = fn()
                    if isinstance(result, torch.Tensor):
                        result.tolist()  # the step's tokens reach the host, as the engine reads them
                    sync()
                    samples.append((time.perf_counter() - t0) * 1e3)
                timings[label] = statistics.median(samples)
            together = batched().tolist()
            alone = [int(batched_sampler.choose_rows([specs()[r]], raw[r:r + 1], [0])) for r in range(rows)]
            graphs_alone = [int(batched_sampler.choose_rows([specs(graphed=True)[r]], raw[r:r + 1], [0]))
                            for r in range(rows)]
            free_together = free().tolist()
            free_alone = [int(batched_sampler.choose_rows([specs(graphed=True, sort_free=True)[r]], raw[r:r + 1], [0]))
                          for r in range(rows)]
            free_eager = batched_sampler.choose_rows(specs(sort_free=True), raw, list(range(rows))).tolist()
            out["levels"].append({"settings": name, "rows": rows, "per_row_ms": timings["per_row"],
                                  "batched_ms": timings["batched"], "graphed_ms": timings["graphed"],
                                  "speedup": timings["per_row"] / timings["batched"],
                                  "graph_speedup": timings["batched"] / timings["graphed"],
                                  "alone_equals_batched": together == alone,
                                  "graphed_equals_eager": graphed().tolist() == together and graphs_alone == alone,
                                  "free_ms": timings["free"], "free_speedup": timings["graphed"] / timings["free"],
                                  "free_alone_equals_batched": free_together == free_alone,
                                  "free_graphed_equals_eager": free_together == free_eager,
                                  "free_same_as_sorted": sum(a == b for a, b in zip(free_together, together))})
    return out


def table(result: dict) -> str:
    def yes(flag):
        return "yes" if flag else "NO"

    lines = ["| settings | rows | row by row, ms | batched, ms | graphed, ms | sort-free graphed, ms | × batched "
             "| × graphed | × sort-free | alone == batched | graphed == eager | sort-free: alone == batched, "
             "graphed == eager, tokens as sorted |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for lv in result["levels"]:
        lines.append(f"| {lv['settings']} | {lv['rows']} | {lv['per_row_ms']:.2f} | {lv['batched_ms']:.2f} | "
                     f"{lv['graphed_ms']:.2f} | {lv['free_ms']:.2f} | {lv['speedup']:.1f} | {lv['graph_speedup']:.2f} | "
                     f"{lv['free_speedup']:.2f} | {yes(lv['alone_equals_batched'])} | {yes(lv['graphed_equals_eager'])} | "
                     f"{yes(lv['free_alone_equals_batched'])}, {yes(lv['free_graphed_equals_eager'])}, "
                     f"{lv['free_same_as_sorted']}/{lv['rows']} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m patchbay.device sampler", description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--rows", default="1,8,32,64,128")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a check of the job itself")
    p.add_argument("--vocab", type=int, default=VOCAB)
    args = p.parse_args(argv)
    result = run([int(r) for r in args.rows.split(",")], args.reps, args.device, args.vocab)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sampler.json").write_text(json.dumps(result, indent=2) + "\n")
    print(table(result))
    return 0 if all(lv["alone_equals_batched"] and lv["graphed_equals_eager"] and lv["free_alone_equals_batched"]
                    and lv["free_graphed_equals_eager"] for lv in result["levels"]) else 1

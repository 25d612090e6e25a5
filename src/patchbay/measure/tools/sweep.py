"""Launch sweeps: a kernel's configurations over a grid, each run checked against a reference run's
bits and timed; the fastest whose bits match is the best. The harness; the engine's own kernels at
air12's shapes are swept by the device job on the GPU machine (patchbay.device.sweep):

    python3 -m patchbay.device sweep gemm OUT [--rows 8192] [--tp 1,2] [--tma] [--tiles 128x128x64w8s3,…]
    python3 -m patchbay.device sweep fp8 OUT [--rows 1] [--tiles 64w4s4,…] [--programs 264,…] [--depths 128,64]
    python3 -m patchbay.device sweep moe OUT [--tokens 8192] [--tp 1,2] [--gate-up 128x64w8s3,…] [--down …]

OUT/sweep-CASE.json is
rewritten after every case (a crash loses nothing done), one JSON line a configuration is printed,
and OUT/command.txt records the command. Timers, by what the kernel's size needs (AGENTS.md):
`graph` captures the calls in a CUDA graph, each with its own copy of the weights so they are read
from HBM, not L2 (decode sizes: timed with events around Python launches a small kernel measures
its launch); `events` times launches between CUDA events (prompt sizes); on a CPU `wall` times
with the host clock, which checks a sweep's plumbing and means little else.

Replaces the harness W12-W14's tune scripts each carried (attn_tune.py, tune2-tune7: timed, gtimed,
copies_for, the bits-against-a-reference loop). The kernel variants those scripts defined for one
question stay in their windows.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from pathlib import Path

L2_BYTES = 96 << 20  # more than an H200's 50 MiB L2, so rotated copies are read from HBM
MOST_COPIES = 64


def cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def copies_for(nbytes: int, l2: int = L2_BYTES, most: int = MOST_COPIES) -> int:
    """How many copies of an operand of nbytes to rotate through so each call reads it past L2."""
    return max(1, min(most, -(-l2 // max(nbytes, 1))))


def wall_ms(make, reps: int = 5, warmup: int = 1) -> float:
    for i in range(warmup):
        make(i)
    t0 = time.perf_counter()
    for i in range(reps):
        make(i)
    return (time.perf_counter() - t0) / reps * 1000


def events_ms(make, reps: int = 20, warmup: int = 3) -> float:
    import torch

    for i in range(warmup):
        make(i)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(reps):
        make(i)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def graph_ms(make, reps: int = 20, replays: int = 5, warmup: int = 3) -> float:
    """Mean ms a call with `reps` calls captured in one CUDA graph (call i: make(i))."""
    import torch

    make(0)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(warmup):
            make(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(reps):
            make(i)
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * reps)


TIMERS = {"wall": wall_ms, "events": events_ms, "graph": graph_ms}


def timer(kind: str):
    """The timer named kind; off a GPU every kind falls back to `wall`."""
    if kind not in TIMERS:
        raise ValueError(f"timer {kind!r} (allowed: {', '.join(TIMERS)})")
    return TIMERS[kind] if kind == "wall" or cuda() else wall_ms


def grid(**axes) -> list[dict]:
    """Every combination of the axes' values, the first axis slowest: grid(m=[1, 2], w=[4]) ->
    [{"m": 1, "w": 4}, {"m": 2, "w": 4}]."""
    names = list(axes)
    return [dict(zip(names, values)) for values in itertools.product(*(axes[n] for n in names))]


def compare(got, ref) -> dict:
    import torch

    return {"same_bits": bool(torch.equal(got, ref)),
            "max_abs": float((got.double() - ref.double()).abs().max()) if got.shape == ref.shape else None}


def sweep(run, configs: list, reference=None, time_with: str = "events", say=print, **timer_args) -> list[dict]:
    """For each config: out = run(config, 0), compared with `reference` (a tensor) when given, and
    timed as run(config, i) for call i (i picks an operand copy; ignore it if there is one).
    A config that raises is recorded with its error and the sweep goes on."""
    clock = timer(time_with)
    rows = []
    for config in configs:
        row = {"cfg": config}
        try:
            out = run(config, 0)
            if reference is not None:
                row.update(compare(out, reference))
            row["ms"] = round(clock(lambda i, c=config: run(c, i), **timer_args), 5)
        except Exception as e:  # noqa: BLE001  (a config the kernel refuses is a result)
            row["error"] = f"{type(e).__name__}: {e}"[:300]
        rows.append(row)
        say(json.dumps(row, default=str))
    return rows


def best(rows: list[dict], same_bits: bool = True) -> dict | None:
    """The fastest row that ran (and, with same_bits, whose bits match the reference)."""
    ok = [r for r in rows if "ms" in r and (not same_bits or r.get("same_bits", True))]
    return min(ok, key=lambda r: r["ms"]) if ok else None


class Results:
    """OUT/sweep-NAME.json: the cases swept so far, rewritten after each."""

    def __init__(self, out: Path, name: str, meta: dict):
        self.path = Path(out) / f"sweep-{name}.json"
        self.data = {**meta, "cases": []}

    def add(self, case: dict, rows: list[dict], **extra) -> dict:
        top = best(rows)
        entry = {"case": case, **extra, "best": None if top is None else top["cfg"], "rows": rows}
        self.data["cases"].append(entry)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))
        return entry


def parse_tiles(text: str, fields: int) -> list[tuple[int, ...]]:
    """`128x128x64w8s3,64x64x64w4s4` -> [(128, 128, 64, 8, 3), …]: a tile's sizes joined by x, then
    its warps (w) and stages (s); `fields` numbers in all."""
    out = []
    for spec in filter(None, text.split(",")):
        sizes, _, rest = spec.partition("w")
        warps, _, stages = rest.partition("s")
        try:
            tile = tuple(int(v) for v in sizes.split("x")) + (int(warps), int(stages))
        except ValueError:
            tile = ()
        if len(tile) != fields:
            raise ValueError(f"{spec!r}: expected {'x'.join(['N'] * (fields - 2))}wWARPSsSTAGES")
        out.append(tile)
    return out

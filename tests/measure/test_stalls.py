import json

from patchbay import ROOT
from patchbay.measure.tools import stall_hook, stalls

from .helpers import run_with_hooks

# A real Triton compile through JITFunction._do_compile with no GPU: the device cache a launch
# would fill from the driver is filled for sm_90 by hand (Triton ships ptxas), then a
# capture-and-log pass as a server makes them.
COMPILE = '''
import logging
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, compile, make_backend

@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)

logging.basicConfig(level=logging.INFO)
logging.getLogger("serve").info("[Request received] Model: tiny, CB: True")
logging.getLogger("serve").info("nothing to see")
target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
add_one.ASTSource, add_one.compile = ASTSource, compile
add_one.device_caches["sm90"] = ({}, {}, target, backend, None)
add_one._do_compile("the-launch-key", {"x_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}, "sm90",
                    {"BLOCK": 64}, backend.parse_options({"num_warps": 4}), {}, True)
import torch
assert getattr(torch.cuda.CUDAGraph.capture_begin, "_pb_measure", False)
'''


def test_the_hook_logs_compiles_and_request_lines_on_the_monotonic_clock(tmp_path):
    events = tmp_path / "events"
    run_with_hooks(COMPILE, tmp_path, timeout=300, STALLPROF_DIR=str(events), RANK="0",
                   TRITON_CACHE_DIR=str(tmp_path / "triton-cache"))
    path, = events.glob("ev-*-r0.tsv")
    got = stalls.read_events(path.read_text())
    assert [e.kind for e in got] == ["start", "log", "triton"]
    assert got[1].name.startswith("[Request received]")
    assert got[2].name == "add_one the-launch-key" and got[2].duration > 0
    assert got[0].t <= got[1].t <= got[2].t
    assert "STALLPROF_DIR=" in (events / "command.txt").read_text()


def test_a_span_times_each_instances_begin_to_its_end():
    class Graph:  # CUDAGraph's shape: capture_begin … capture_end on one instance
        def capture_begin(self):
            return "began"

        def capture_end(self):
            return "ended"

    seen = []
    stall_hook.span(Graph, "capture_begin", "capture_end", lambda *e: seen.append(e), "graph", "capture")
    stall_hook.span(Graph, "capture_begin", "capture_end", lambda *e: seen.append(e), "graph", "capture")  # once
    a, b = Graph(), Graph()
    assert a.capture_begin() == "began"
    b.capture_begin()
    assert b.capture_end() == "ended"
    a.capture_end()
    assert [e[:2] for e in seen] == [("graph", "capture")] * 2
    (_, _, b0, b1), (_, _, a0, a1) = seen
    assert a0 < b0 <= b1 <= a1  # a began first and ended last


def synthetic_part(tmp_path):
    part = tmp_path / "part"
    (part / "events").mkdir(parents=True)
    (part / "epoch.txt").write_text("EPOCH 100.000000\n")
    (part / "config.json").write_text(json.dumps({"url": "http://127.0.0.1:8071",
                                                  "b_server": {"url": "http://127.0.0.1:8072"}}))
    rows = []
    for arm, start in (("A", 1.0), ("B", 20.0)):
        for copy in range(3):
            rows.append({"rep": 0, "concurrency": 8, "arm": arm, "t_start": start + 0.01 * copy,
                         "t_first": start + (2.0 if arm == "A" else 0.05) + 0.01 * copy,
                         "t_last": start + 4.0, "error": None if copy else "HTTP 500: x"})
    (part / "raw.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = {8071: [(98.0, 0, "start", "-m serve m --port 8071"), (100.9, 1.5, "triton", "pb_sort key"),
                 (101.0, 0.1, "triton", "pb_gemm key"), (102.0, 0.2, "graph", "capture"),
                 (130.0, 3.0, "triton", "pb_late key")],  # in nobody's pass
          8072: [(98.0, 0, "start", "-m serve m --port 8072"), (121.0, 0.3, "graph", "capture")]}
    for n, (port, lines) in enumerate(ev.items()):
        (part / "events" / f"ev-{n}-r0.tsv").write_text("".join(f"{t}\t{d}\t{k}\t{name}\n" for t, d, k, name in lines))
    (part / "events" / "ev-9-r1.tsv").write_text("98.0\t0\tstart\t-m serve m --port 8071\n101.0\t9\ttriton\tr1 key\n")
    return part


def test_each_pass_gets_the_compiles_and_captures_its_arms_server_logged_meanwhile(tmp_path):
    lines = stalls.render(synthetic_part(tmp_path)).splitlines()
    assert lines[2:] == ["| 0, C8, A | 1 | 2000 / 2000 | 2, 1.60 | pb_gemm, pb_sort | 1, 0.20 |",
                         "| 0, C8, B | 1 | 50 / 50 | 0, 0.00 | - | 1, 0.30 |"]


def test_stalls_reproduces_w15s_table_from_its_records(tmp_path):
    part = ROOT / "results" / "W15-adopted-set-tp2-h200" / "compile-stalls-tp2-api"
    assert stalls.main([str(part), "--out", str(tmp_path / "stalls.md")]) == 0
    assert (tmp_path / "stalls.md").read_text() == (part / "stalls.md").read_text()

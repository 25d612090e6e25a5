"""The GPU decode path's patches on the CPU: 0230's graph buckets (PB_GRAPH_BUCKETS), 0240's
async batching with masks (PB_ASYNC_BATCHING), 0250's switch interval (PB_SWITCH_INTERVAL),
0260's compile level (PB_COMPILE_LEVEL), 0270's causal prefill (PB_CAUSAL_PREFILL) and 0100's
greedy rows.

Their effect needs CUDA graphs (W04, W05 on an H200); here the rules are checked and the hooks
are called through upstream's own functions in a fresh interpreter, with the knobs on and off.
"""

import pytest

from .conftest import engine_code, engine_jobs, engine_module

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def jobs(patched_engine, tiny_model):
    """The job's checks with the knobs off and on, started together; with --replies, also the tiny
    model's greedy replies through batching. 0270 (causal) alone: compile (0260) would trace sdpa
    once instead of calling it every step."""
    on = {"PB_GRAPH_BUCKETS": "1", "PB_ASYNC_BATCHING": "1", "PB_SWITCH_INTERVAL": "500", "PB_COMPILE_LEVEL": "1"}
    with engine_jobs("decode_path_job.py", patched_engine, tiny_model, "--replies", timeout=300,
                     runs={"off": {}, "causal": {"PB_CAUSAL_PREFILL": "1"}}) as with_replies, \
            engine_jobs("decode_path_job.py", patched_engine, tiny_model, timeout=300, runs={"on": on}) as checks:
        yield {**with_replies, **checks}


@pytest.fixture(scope="module")
def off(jobs):
    return jobs["off"].report()


@pytest.fixture(scope="module")
def on(jobs):
    return jobs["on"].report()


@pytest.fixture(scope="module")
def causal(jobs):
    return jobs["causal"].report()


def test_round_up_keeps_small_sizes_and_bounds_the_padding(patched_engine):
    buckets = engine_module(patched_engine, "runtime.buckets")
    for parts in (1, 4, 8):
        assert [buckets.round_up(n, parts) for n in range(1, 2 * parts + 1)] == list(range(1, 2 * parts + 1)) \
            if parts > 1 else [1, 2]
        for n in range(1, 70_000):
            r = buckets.round_up(n, parts)
            assert n <= r < n * (1 + 1 / parts) + 1e-9 or n <= 2 * parts, (n, parts, r)
    assert buckets.round_up(0, 4) == 0
    assert [buckets.round_up(n, 1) for n in (3, 5, 33, 64, 65)] == [4, 8, 64, 64, 128]


def test_pad_rounds_to_few_shapes_within_the_caps(patched_engine):
    buckets = engine_module(patched_engine, "runtime.buckets")
    qs = {buckets.pad(q, 0, 8192, 10**6)[0] for q in range(1, 8193)}
    kvs = {buckets.pad(1, kv, 8192, 10**6)[1] for kv in range(0, 10**6 + 1, 97)}
    # graphs grow with the logarithm of the sizes: 7 powers of two, then 8 shapes an octave for the
    # query (upstream: 128 multiples of 64 up to 8192), 4 an octave for the KV read
    assert len(qs) <= 7 + 8 * 7 and len(kvs) <= 4 * 13
    assert {q for q in qs if q <= 64} == {1, 2, 4, 8, 16, 32, 64}
    assert buckets.pad(1, 0, 8192, 10**6) == (1, 0)  # no cache to read: no KV read padded in
    assert buckets.pad(1, 1, 8192, 10**6) == (1, buckets.KV_FLOOR)
    assert buckets.pad(9000, 999_999, 8192, 500_000) == (8192, 500_000)  # capped like upstream's


def test_knobs_off_pad_as_upstream(off):
    # multiples of 64 query tokens and of 16,384 KV tokens (a step reading no cache too), capped
    assert off["padding"] == {"1,0": [64, 16384], "1,300": [64, 16384], "3,900": [64, 16384],
                              "32,6000": [64, 16384], "100,0": [128, 16384], "5000,70000": [4096, 81920],
                              "1,250000": [64, 200000]}


def test_buckets_pad_to_the_batch(on):
    assert on["padding"] == {"1,0": [1, 0], "1,300": [1, 320], "3,900": [4, 1024], "32,6000": [32, 6144],
                             "100,0": [104, 0], "5000,70000": [4096, 81920], "1,250000": [1, 200000]}


def test_transfer_copies_whole_buffers_when_off_and_the_read_region_when_on(off, on):
    # host buffers: 16 query rows x 64 key columns of ones; the step: 8 padded query tokens, 24 padded keys
    assert off["transfer"] == {"bulk_equal": True, "write_index": 16.0, "read_index": 64.0,
                               "mask_region_equal": True, "mask_outside_region_untouched": False,
                               "host_builds_mask_next": True}
    # on: only the indices the step reads are copied, and the device builds the same mask region itself
    assert on["transfer"] == {"bulk_equal": True, "write_index": 8.0, "read_index": 32.0,
                              "mask_region_equal": True, "mask_outside_region_untouched": True,
                              "host_builds_mask_next": False}


def test_device_mask_is_upstreams_mask(off):
    """0240's mask, built with tensor ops from the cumulative lengths, equals upstream's
    build_attention_mask on 300 random steps: chunks continuing cached keys, fresh prompts,
    decode rows, empty sequences, padding rows and columns, sliding windows, bf16 and fp32."""
    assert off["mask_cases"] == 300 and off["mask_mismatches"] == []


def test_async_batching_is_chosen_with_graphs_only_when_on(off, on):
    assert off["async_with_graphs"] is False  # upstream: a mask is needed, so no async
    assert on["async_with_graphs"] is True
    assert on["async_without_graphs"] is False and off["async_without_graphs"] is False


def test_compile_level_is_set_by_the_knob_unless_the_config_sets_one(off, on):
    assert off["compile_levels"] == [[0, None], [2, "max-autotune-no-cudagraphs"]]
    assert on["compile_levels"] == [[1, "default"], [2, "max-autotune-no-cudagraphs"]]


def test_switch_interval_is_set_only_by_the_knob(patched_engine, off):
    assert off["switch_interval"] == pytest.approx(0.005)  # Python's own
    code = "import sys; from transformers._pb.runtime import switch; switch.apply(); print(sys.getswitchinterval())"
    proc = engine_code(code, patched_engine, PB_SWITCH_INTERVAL="500")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout) == pytest.approx(0.0005)
    proc = engine_code(code, patched_engine, PB_SWITCH_INTERVAL="-1")
    assert proc.returncode != 0 and "PB_SWITCH_INTERVAL=-1 is not a valid value" in proc.stderr


def test_graph_max_q_leaves_only_steps_up_to_the_limit_to_graphs(patched_engine):
    """0680: with PB_GRAPH_MAX_Q=N a step of more than N query tokens (after padding) runs eagerly;
    unset, every step may replay a graph as upstream's do."""
    code = ("from transformers._pb.runtime import graph_steps; "
            "print([graph_steps.graphed(q) for q in (1, 32, 64, 65, 4096)])")
    unset = engine_code(code, patched_engine)
    limited = engine_code(code, patched_engine, PB_GRAPH_MAX_Q="64")
    assert unset.returncode == 0 and limited.returncode == 0, (unset.stderr[-2000:], limited.stderr[-2000:])
    assert unset.stdout.strip() == "[True, True, True, True, True]"
    assert limited.stdout.strip() == "[True, True, True, False, False]"



GRAPH_AFTER_CODE = """
from types import SimpleNamespace
from transformers._pb.runtime import graph_after
from transformers.generation.continuous_batching.utils import CudaGraphBuffer


class Graph:  # what CudaGraphBuffer keeps and resets; the decision reads only whether one is kept
    def reset(self):
        pass


def device_io(key):
    io = SimpleNamespace(graphs=CudaGraphBuffer(), key=key)
    io._get_graph_key = lambda: io.key
    return io


io = device_io((32, 4096, 640))
seen = []
for step in range(3):
    due = graph_after.graphed(io)
    seen.append(due)
    if due:
        io.graphs.set_graph(io.key, Graph())  # what the runner does when it captures
seen.append(graph_after.graphed(io))  # the shape now has its graph: replayed
io.key = (33, 4096, 640)  # a new shape starts its own count
seen.append(graph_after.graphed(io))
pairs = SimpleNamespace(io_pairs=[SimpleNamespace(device_io=device_io((1,))), SimpleNamespace(device_io=device_io((1,)))],
                        current_pair=1)
seen.append(graph_after.graphed(pairs))
seen.append(len(pairs.io_pairs[0].device_io.__dict__.get("_pb_graph_sightings", {})))
seen.append(len(pairs.io_pairs[1].device_io.__dict__.get("_pb_graph_sightings", {})))
print(seen)
"""


def test_graph_after_captures_a_shape_the_time_it_comes_back(patched_engine):
    """0710: with PB_GRAPH_AFTER=N a step shape without a graph runs eagerly its first N times and
    is captured the time after; once it has its graph it replays; each IO pair counts its own
    shapes. Unset, every step may capture at once, as upstream's."""
    unset = engine_code(GRAPH_AFTER_CODE, patched_engine)
    after = engine_code(GRAPH_AFTER_CODE, patched_engine, PB_GRAPH_AFTER="2")
    assert unset.returncode == 0 and after.returncode == 0, (unset.stderr[-2000:], after.stderr[-2000:])
    assert unset.stdout.strip() == "[True, True, True, True, True, True, 0, 0]"
    # eager, eager, captured; replayed; a new shape eager; the second pair's shape eager, counted there
    assert after.stdout.strip() == "[False, False, True, True, False, False, 0, 1]"

def test_plain_greedy_rows_of_a_greedy_batch_are_left_to_the_batch(patched_engine):
    """0100's hook: a temperature-0 request in a batch that is itself greedy already has the
    batch's argmax, so the hook leaves its row (no kernels, no wait for the logits: under
    CUDA graphs with 0210 it runs after every replay); rows that need their own choice, or any
    row of a batch that samples, are still chosen again."""
    from types import SimpleNamespace

    import torch

    sampler = engine_module(patched_engine, "runtime.sampler")
    logits = torch.tensor([[[0.0, 5.0, 1.0], [3.0, 0.0, 1.0], [0.0, 1.0, 2.0]]])
    states = [SimpleNamespace(request_id=r) for r in ("greedy-a", "greedy-b", "biased")]
    io = SimpleNamespace(requests_in_batch=[SimpleNamespace(state=s, has_new_token=True) for s in states])

    def runner(do_sample=False, return_logprobs=False, processing=False):
        return SimpleNamespace(inputs_and_outputs=io, do_sample=do_sample, return_logprobs=return_logprobs,
                               logit_processor=SimpleNamespace(do_processing=processing))

    specs = {"greedy-a": sampler.Spec(), "greedy-b": sampler.Spec(), "biased": sampler.Spec(logit_bias={0: 100.0})}
    for request_id, spec in specs.items():
        sampler.register(request_id, spec)
    try:
        out = torch.full((1, 3), 7)
        sampler._override(runner(), logits, out)
        assert out.tolist() == [[7, 7, 0]]  # only the biased row is chosen again
        assert specs["greedy-a"].tokens == [] and specs["biased"].tokens == [0]
        for setting in ({"do_sample": True}, {"return_logprobs": True}, {"processing": True}):
            out = torch.full((1, 3), 7)
            sampler._override(runner(**setting), logits, out)
            assert out.tolist() == [[1, 0, 0]], setting  # the batch's own choice is not raw argmax
    finally:
        for request_id in specs:
            sampler.release(request_id)


def test_a_lone_fresh_prompt_runs_causal_and_replies_as_with_the_mask(off, causal):
    """0270: a prompt alone, with nothing cached, is attended with sdpa's causal kernel and no
    mask in every layer; its greedy reply is the masked path's. Prompts that share the step, and
    every decode step, keep upstream's mask; knob off, no call runs causal."""
    a, b = off["causal_prefill"], causal["causal_prefill"]
    assert a["alone"] == b["alone"] and a["together"] == b["together"]
    assert all(len(reply) == 12 for reply in b["alone"] + b["together"])
    for calls in b["alone_calls"]:
        prefill = [c for c in calls if c["q"] == c["k"]]
        assert len(prefill) == b["layers"] and all(c["causal"] and not c["mask"] for c in prefill), calls
    assert b["together_calls"] and all(c["mask"] and not c["causal"] for c in b["together_calls"])
    assert all(c["mask"] and not c["causal"] for calls in a["alone_calls"] for c in calls)
    # while a graph is captured the model builds a mask of its own; the causal step drops it
    assert a["capturing"] == b["capturing"] == a["alone"][0]
    prefill = [c for c in b["capturing_calls"] if c["q"] == c["k"]]
    assert len(prefill) == b["layers"] and all(c["causal"] and not c["mask"] for c in prefill), prefill
    assert all(c["mask"] and not c["causal"] for c in a["capturing_calls"])
    # 0270 counts what it marked: the four lone prompts causal, the shared step and the decode
    # steps not, each under the first condition that failed; nothing with the knob off
    assert a["steps"] == {} and b["steps"]["causal"] == 4, b["steps"]
    assert set(b["steps"]) <= {"causal", "not: one sequence", "not: nothing cached", "not: more than one query token"}


def test_compile_level_compiles_every_layer(patched_engine, tiny_model):
    """0260 raises dynamo's recompile limits in the thread that compiles: with 12 layers, upstream's
    default (8 entries a frame) is hit and the later layers run uncompiled; with the knob, none is
    hit. The compiled replies equal the eager ones either way."""
    with engine_jobs("compile_job.py", patched_engine, tiny_model,
                     runs={"on": {"PB_COMPILE_LEVEL": "1"}, "off": {}}) as jobs:
        on, off = jobs["on"].report(), jobs["off"].report()
    assert on["limit_hits"] == [] and on["compiled"] == on["eager"]
    assert len({tuple(r) for r in on["eager"]}) == 2  # two prompts, two different replies
    assert "recompile_limit" in off["limit_hits"] and off["compiled"] == off["eager"] == on["eager"]


def test_a_compiled_server_warms_up_before_its_first_batch(patched_engine, tiny_model, server_on, tmp_path):
    """0260 under `transformers serve`, which never warms up: with the knob on, the batching
    thread runs upstream's warm-up (compile and, with graphs, capture) before the first batch,
    and the compiled server's greedy replies equal the uncompiled one's."""
    from patchbay.measure import exact

    from .conftest import ALL_ON, Server

    server = Server(patched_engine, tiny_model, {**ALL_ON, "PB_COMPILE_LEVEL": "1"}, tmp_path / "run")
    try:
        log = server.files.log.read_text()
        assert "upstream's warm-up ran before the first batch" in log, log[-2000:]
        assert "hit config.recompile_limit" not in log
        rows = exact.check_servers(server_on.url, server.url, server_on.model, max_tokens=24)
        assert len(rows) == 8 and all(r["equal"] for r in rows), rows
    finally:
        server.stop()


def test_page_indices_write_upstreams_read_indices_every_step(patched_engine, tiny_model):
    """0700: with PB_PAGE_INDICES=1 each step's read indices come from the requests' pages with a
    few array operations, not a Python int per cached token; they must be upstream's, value for
    value, in every step of a batch whose contexts span several 16-token pages and end mid-page
    (prompts longer than a step's token budget, so some steps carry prompt chunks)."""
    with engine_jobs("page_indices_job.py", patched_engine, str(tiny_model), timeout=300,
                     runs={"off": {}, "on": {"PB_PAGE_INDICES": "1"}}) as jobs:
        off, on = jobs["off"].report(), jobs["on"].report()
    assert max(off["prompt_tokens"]) > 64 and min(off["prompt_tokens"]) < 16
    read = [sum(len(group) for group in step) for step in off["steps"]]
    assert len(off["steps"]) > 40 and max(read) > 200  # steps that read several pages of several requests
    assert on["steps"] == off["steps"]
    assert on["replies"] == off["replies"]

"""0670 PB_GRAPH_LOGITS on an NVIDIA GPU: graphs captured after the first copy their logits into
one shared buffer instead of keeping their own, and every replay still hands 0210's hook its own
step's logits. Runs on the device (`scripts/gpu-run.sh patched python3 -m pytest -m gpu
tests/test_graph_logits_gpu.py`), never in CI."""

import pytest

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

VOCAB = 151_552


def capture(graphs, x, w, pool):
    """A graph computing [1, rows, vocab] float32 logits from x [rows, hidden], noted as the
    batching engine's forward notes them, in the memory pool all graphs share (as upstream's);
    returns (graph, the tensor its logits are read from,
    the memory its capture kept)."""
    def forward():
        logits = (x @ w).float()[None]
        graphs.note_capture(logits)
        return logits

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()  # warm-up, as the engine's
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        forward()
    graphs.captured(graph)
    torch.cuda.synchronize()
    return graph, graphs._captured[id(graph)], torch.cuda.memory_allocated() - before


@pytest.mark.parametrize("knob", [0, 1])
def test_graphs_after_the_first_share_one_logits_buffer_and_replay_their_own(knob, monkeypatch):
    from transformers._pb import knobs
    from transformers._pb.runtime import graphs

    monkeypatch.setenv("PB_GRAPH_SAMPLING", "1")
    monkeypatch.setenv("PB_GRAPH_LOGITS", str(knob))
    knobs.load()
    graphs._captured.clear(), graphs._shared.clear()
    torch.manual_seed(0)
    w = torch.randn(256, VOCAB, device="cuda", dtype=torch.bfloat16)
    xs = [torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16) for rows in (4, 1024, 512, 1024)]
    pool = torch.cuda.graph_pool_handle()
    made = [capture(graphs, x, w, pool) for x in xs]
    logits_bytes = 1024 * VOCAB * 4
    if knob:
        buf = graphs._shared[torch.device("cuda", torch.cuda.current_device())]
        assert buf.shape == (1024, VOCAB)
        for _, seen, _ in made[1:]:  # views of the shared buffer, not memory of their own
            assert buf.data_ptr() == seen.data_ptr()
        assert all(kept < logits_bytes // 2 for _, _, kept in made[2:])
    else:
        assert made[3][2] >= logits_bytes  # each prompt-sized graph keeps its 592 MiB
    for _ in range(2):
        for (graph, seen, _), x in zip(made, xs):
            x.copy_(torch.randn_like(x))
            graph.replay()
            assert torch.equal(seen[0], (x @ w).float())  # what the hook reads after this replay
    knobs.load({})

"""0800 on an NVIDIA GPU: a drafting row's mask (drafts._RowMask) leaves finite exactly the tokens
its bitmask row allows, as on the CPU. W54's drafted replies differed from serial ones because
xgrammar's GPU kernel, given a 1-D bitmask row, kept only the first 32 token ids. Runs on the
device (`scripts/gpu-run.sh patched python3 -m pytest -m gpu tests/test_drafts_gpu.py`), never
in CI."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("xgrammar")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]


@pytest.mark.parametrize("vocab", [4000, 151_552])
def test_a_drafting_rows_mask_keeps_the_tokens_its_row_allows(vocab):
    import xgrammar as xgr
    from transformers._pb.runtime import drafts

    words = xgr.get_bitmask_shape(1, vocab)[1]
    generator = torch.Generator().manual_seed(vocab)
    allowed = torch.rand(3, vocab, generator=generator) < 0.3  # rows as draft_masks returns them
    bits = torch.zeros(3, words * 32, dtype=torch.int64)
    bits[:, :vocab] = allowed.long()
    packed = (bits.view(3, words, 32) << torch.arange(32)).sum(-1)
    rows = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    for r in range(3):
        mask = drafts._RowMask(rows[r], None)  # a 1-D view of the [rows, words] tensor
        scores = torch.randn(vocab, generator=generator)
        on_gpu = mask(None, scores.cuda().clone()).cpu()
        on_cpu = mask(None, scores.clone())
        assert torch.equal(torch.isfinite(on_gpu), allowed[r]), (r, int(torch.isfinite(on_gpu).sum()),
                                                                 int(allowed[r].sum()))
        assert torch.equal(on_gpu, on_cpu)


@pytest.fixture(scope="module")
def async_runs(trained_model):
    """tests/draft_job.py on the GPU (bfloat16, asynchronous batching), the production set's knobs
    on one GPU with 0860: without drafting; drafting at any load (the loop waits for every step
    while a request may draft); drafting within 0820's limit of 2 (it overlaps while three are
    held). draft_job builds the model through the server's load sequence, so its steps take the
    batch-invariant kernels (W62: without them a seeded sampled reply parted from the serial one).
    The engine on PYTHONPATH (scripts/gpu-run.sh patched)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from patchbay.runtime.config import knob_set

    base = {k: v for k, v in os.environ.items() if not k.startswith("PB_")}
    prod = {**knob_set("prod"), "PB_TENSOR_PARALLEL": "0", "PB_HOST_TIER_MB": "0", "PB_DRAFT_ASYNC": "1"}
    runs = {"off": {"PB_DRAFT_TOKENS": "0"}, "on": {"PB_DRAFT_TOKENS": "8", "PB_DRAFT_STREAMS": "0"},
            "limit": {"PB_DRAFT_TOKENS": "8", "PB_DRAFT_STREAMS": "2"}}
    job = Path(__file__).with_name("draft_job.py")
    reports = {}
    for name, extra in runs.items():
        env = {**base, **prod, **extra, "DRAFT_JOB_DEVICE": "cuda"}
        done = subprocess.run([sys.executable, str(job), trained_model, "48"], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        reports[name] = json.loads(done.stdout.strip().splitlines()[-1])
    return reports


PHASES = ("greedy_together", "greedy_alone", "sampled_together", "sampled_alone", "follow_up", "masked_greedy",
          "masked_sampled", "masked_alone", "greedy_staggered")


def test_drafting_inside_the_asynchronous_loop_replies_as_serial(async_runs):
    """0860 on the GPU: every phase's replies with drafts (at any load, and within the limit of
    2) are the replies without, token for token; the loop waited for steps and verified drafts
    in every phase at any load; within the limit, three requests held drafted less (nothing once
    all three were in), and the staggered phase drafted once the load fell to two."""
    off, on, limit = async_runs["off"], async_runs["on"], async_runs["limit"]
    for phase in PHASES:
        assert on[phase] == off[phase], phase
        assert limit[phase] == off[phase], phase
        assert off["counts"][phase]["verify_steps"] == 0 and off["counts"][phase]["waits"] == 0, phase
        counts = on["counts"][phase]
        assert counts["waits"] > 0 and counts["verify_steps"] > 0 and 0 < counts["kept"] <= counts["drafted"], \
            (phase, counts)
    assert off["greedy_together"] == off["greedy_alone"] and off["sampled_together"] == off["sampled_alone"]
    assert limit["counts"]["greedy_together"]["verify_steps"] < on["counts"]["greedy_together"]["verify_steps"]
    assert limit["counts"]["greedy_staggered"]["verify_steps"] > 0, limit["counts"]
    assert limit["counts"]["greedy_staggered"]["held_when_drafting"] <= 2, limit["counts"]
    assert on["counts"]["greedy_alone"]["steps"] * 3 <= off["counts"]["greedy_alone"]["steps"] * 2, on["counts"]

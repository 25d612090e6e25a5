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

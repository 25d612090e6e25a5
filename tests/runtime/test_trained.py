"""synthetic:trained: trained deterministically from its seed, and it has learnt to copy a passage
it has read, alone and served by the engine."""

import dataclasses
import json
import re
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from patchbay.runtime import synth, trained

from ..conftest import ALL_ON, Server

# A recipe small enough to train twice in seconds: what it learns does not matter here, its bits do.
SHORT = dataclasses.replace(trained.RECIPE, files=3, steps=6, batch=4, length=64)


def weights(seed: int, recipe=SHORT) -> dict:
    model, _, stats = trained.train(seed, synth.TINY_CONTEXT, recipe)
    assert stats["train_tokens"] > 1000 and 0 < stats["final_loss"] < 20
    return model.state_dict()


def test_training_is_deterministic_from_its_seed():
    first, again, other = weights(0), weights(0), weights(1)
    assert first.keys() == again.keys() == other.keys()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_a_batch_is_half_plain_windows_half_shown_twice():
    tokens = torch.arange(10_000)
    ids = trained.batch(tokens, torch.Generator().manual_seed(0), SHORT)
    assert ids.shape == (SHORT.batch, SHORT.length)
    half = SHORT.length // 2
    for row in ids[:SHORT.batch - SHORT.copies]:  # consecutive text
        assert torch.equal(row, torch.arange(row[0], row[0] + SHORT.length))
    for row in ids[SHORT.batch - SHORT.copies:]:  # a half window, then the same again
        assert torch.equal(row[:half], row[half:]) and torch.equal(row[:half], torch.arange(row[0], row[0] + half))


def test_write_trained_refuses_a_folder_of_someone_elses(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match=re.escape(str(tmp_path))):
        trained.write_trained(tmp_path, seed=0, recipe=SHORT)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def held_out_text() -> str:
    """A library source the model was not trained on (the first after the training files)."""
    return trained.library_files()[trained.RECIPE.files].read_text()


def test_the_trained_model_copies_what_it_has_read(trained_model):
    path = Path(trained_model)
    marker = json.loads((path / synth.MARKER).read_text())
    assert marker["model"] == "synthetic:trained" and marker["seed"] == 0
    assert marker["recipe"] == dataclasses.asdict(trained.RECIPE)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert model.config.model_type == "glm4_moe"
    # The figure the marker records is this checkpoint's own (recomputed on the held-out files).
    held = torch.tensor(sum((tok.backend_tokenizer.encode(p.read_text(), add_special_tokens=False).ids
                             for p in trained.library_files()[trained.RECIPE.files:trained.RECIPE.files + 10]), []))
    accuracy = trained.copy_accuracy(model, held)
    assert accuracy == pytest.approx(marker["copy_accuracy_held_out"], abs=1e-3)
    assert accuracy > 0.9, marker
    # Greedy decoding continues a passage shown once: the next 40 tokens are the passage's own.
    span = tok(held_out_text()[2000:2600], add_special_tokens=False)["input_ids"][:120]
    prompt = torch.tensor([span + span[:16]])
    out = model.generate(prompt, max_new_tokens=40, do_sample=False)[0, prompt.shape[1]:].tolist()
    assert out == span[16:56]
    # Before training, the same weights' shape continues it no better than chance.
    torch.manual_seed(0)
    untrained = type(model)(model.config).eval()
    noise = untrained.generate(prompt, max_new_tokens=40, do_sample=False)[0, prompt.shape[1]:].tolist()
    assert sum(a == b for a, b in zip(noise, span[16:56])) < 10


def test_write_trained_keeps_a_matching_checkpoint(trained_model):
    path = Path(trained_model)
    before = {p.name: p.stat().st_mtime_ns for p in path.iterdir()}
    context = json.loads((path / synth.MARKER).read_text())["context"]
    assert trained.write_trained(path, seed=0, context=context) == path
    assert {p.name: p.stat().st_mtime_ns for p in path.iterdir()} == before


def test_the_engine_serves_the_trained_model_copying(patched_engine, trained_model, tmp_path):
    """Served by the patched engine with the local knob set, a prompt that repeats the start of a
    passage gets the rest of it back (greedy), through /v1/completions."""
    server = Server(patched_engine, trained_model, ALL_ON, tmp_path / "run")
    try:
        passage = held_out_text()[3000:3800]
        cut = len(passage) // 2
        body = {"model": server.model, "prompt": passage + passage[:cut], "max_tokens": 48, "temperature": 0}
        r = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        text = r.json()["choices"][0]["text"]
        assert len(text) > 60 and passage[cut:].startswith(text[:60]), (text, passage[cut:cut + 120])
    finally:
        server.stop()

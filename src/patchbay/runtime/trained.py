"""`synthetic:trained`: a small glm4_moe trained here on Python standard-library sources, long
enough to learn to copy what it has seen in its context.

The other synthetic models have random weights: their replies are noise, so a drafter that guesses
the next tokens from the prompt can never be right, and a reply cannot be read for sense. This one
is trained on the interpreter's own library sources (nothing is downloaded) with the tokenizer of
`synthetic:tiny`. Half of every batch is a window of text shown twice in a row, so the model learns
to continue a passage it has already read: an edit of a given file comes back as a copy, which is
what prompt-lookup drafting and prefix reuse are measured on.

Training is deterministic from the seed on one machine: a fixed thread count, a seeded generator
for the batches and for the initial weights. It takes about eight minutes on two CPU cores; the
checkpoint (about 5.4 MB of float32) is kept under .cache/models and rebuilt only when its marker
does not match (another seed, recipe, corpus or chat template).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sysconfig
import time
from pathlib import Path

import torch
from transformers import GenerationConfig, Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.utils import logging as hf_logging

from . import synth

TRAINED = "synthetic:trained"


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How the model is trained; every field goes into the marker, so a change retrains."""

    files: int = 120  # the first this many library sources of at least min_bytes, by name
    min_bytes: int = 4000
    steps: int = 1200
    batch: int = 16  # sequences a step
    copies: int = 5  # of them a span of text repeated to the length
    shuffled: int = 5  # of them a span of the corpus's tokens drawn at random, repeated to the length
    min_span: int = 16  # the shortest span repeated (the longest: half the length)
    length: int = 256  # tokens a sequence
    lr: float = 3e-3
    warmup: int = 50  # steps of linear warm-up, then a cosine down to 0
    clip: float = 1.0
    threads: int = 2  # torch CPU threads while training: the reduction order, so the bits


RECIPE = Recipe()


def trained_config(vocab_size: int, stop: list[int], pad: int, context: int) -> Glm4MoeConfig:
    """tiny's features (dense first layer, shared and four routed experts, GQA, partial rotary,
    q/k/v biases) a little wider: 1.35 M parameters with the 4,000-token vocabulary."""
    return Glm4MoeConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        intermediate_size=256,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=64,
        partial_rotary_factor=0.5,
        max_position_embeddings=context,  # no weight depends on it; trained on 256-token windows
        attention_bias=True,
        initializer_range=0.02,
        tie_word_embeddings=False,
        num_mtp_layers=0,
        eos_token_id=stop,
        pad_token_id=pad,
        dtype="float32",
    )


def library_files(recipe: Recipe = RECIPE) -> list[Path]:
    """The training sources (by name) followed by those held out: every top-level .py file of
    the standard library of at least min_bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(root.glob("*.py")) if p.stat().st_size >= recipe.min_bytes]


def corpus_sha256(recipe: Recipe = RECIPE) -> str:
    """sha256 over the training files' names and bytes."""
    digest = hashlib.sha256()
    for path in library_files(recipe)[:recipe.files]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def corpus(tok, recipe: Recipe = RECIPE) -> tuple[torch.Tensor, torch.Tensor]:
    """(training token ids, held-out token ids: the ten files after the training ones)."""
    train, held = [], []
    for i, path in enumerate(library_files(recipe)[:recipe.files + 10]):
        ids = tok.backend_tokenizer.encode(path.read_text(errors="replace"), add_special_tokens=False).ids
        (train if i < recipe.files else held).extend(ids)
    return torch.tensor(train), torch.tensor(held)


def batch(tokens: torch.Tensor, generator: torch.Generator, recipe: Recipe = RECIPE) -> torch.Tensor:
    """One training batch of `batch` rows of `length` tokens: plain windows of text, then `copies`
    rows of a span of text repeated to the length, then `shuffled` rows of a span of the corpus's
    tokens drawn at random, repeated. Each span's length is drawn from min_span to half the length,
    so only copying by content predicts a repeat (a fixed period would teach the model to look a
    fixed distance back instead); the shuffled spans can only be predicted by copying."""
    plain = recipe.batch - recipe.copies - recipe.shuffled
    rows = []
    for row in range(recipe.batch):
        if row < plain:
            start = int(torch.randint(0, len(tokens) - recipe.length, (1,), generator=generator))
            rows.append(tokens[start:start + recipe.length])
            continue
        span = int(torch.randint(recipe.min_span, recipe.length // 2 + 1, (1,), generator=generator))
        if row < plain + recipe.copies:
            start = int(torch.randint(0, len(tokens) - span, (1,), generator=generator))
            piece = tokens[start:start + span]
        else:
            piece = tokens[torch.randint(0, len(tokens), (span,), generator=generator)]
        rows.append(piece.repeat(-(-recipe.length // span))[:recipe.length])
    return torch.stack(rows)


def copy_accuracy(model, tokens: torch.Tensor, spans: int = 8, half: int = 64) -> float:
    """How often the model's top token is the right one in the second showing of a span it has
    just read (teacher-forced, spans of `half` tokens of `tokens`, evenly spaced)."""
    step = max(1, (len(tokens) - half) // spans)
    seqs = torch.stack([tokens[i * step:i * step + half].repeat(2) for i in range(spans)])
    with torch.no_grad():
        logits = model(input_ids=seqs).logits
    guess = logits[:, half - 1:-1].argmax(-1)
    return (guess == seqs[:, half:]).float().mean().item()


def train(seed: int, context: int, recipe: Recipe = RECIPE, log=None):
    """The trained model (in eval mode), its tokenizer, and what the marker records of the run."""
    tok = synth.build_tokenizer(seed, context)
    stop = synth.stop_ids(tok)
    tokens, held = corpus(tok, recipe)
    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        torch.manual_seed(seed)
        model = Glm4MoeForCausalLM(trained_config(len(tok), stop, tok.pad_token_id, context))
        generator = torch.Generator().manual_seed(seed)
        optim = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95), weight_decay=0.1)

        def rate(step: int) -> float:
            if step < recipe.warmup:
                return (step + 1) / recipe.warmup
            done = (step - recipe.warmup) / max(1, recipe.steps - recipe.warmup)
            return 0.5 * (1 + math.cos(math.pi * done))

        schedule = torch.optim.lr_scheduler.LambdaLR(optim, rate)
        model.train()
        began, loss = time.monotonic(), float("nan")
        for step in range(recipe.steps):
            ids = batch(tokens, generator, recipe)
            loss = model(input_ids=ids, labels=ids).loss
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
            optim.step()
            schedule.step()
            if log is not None and (step % 100 == 0 or step == recipe.steps - 1):
                model.eval()
                copying = copy_accuracy(model, held)
                model.train()
                log(f"step {step}: loss {loss.item():.3f}, copies {copying:.3f} of held-out tokens "
                    f"({time.monotonic() - began:.0f} s)")
        model.eval()
        stats = {"final_loss": round(loss.item(), 4), "copy_accuracy_held_out": round(copy_accuracy(model, held), 4),
                 "train_seconds": round(time.monotonic() - began, 1), "train_tokens": len(tokens)}
    finally:
        torch.set_num_threads(threads)
    model.generation_config = GenerationConfig(do_sample=False, eos_token_id=stop, pad_token_id=tok.pad_token_id)
    return model, tok, stats


def _marker(seed: int, context: int, corpus_sha: str, recipe: Recipe) -> dict:
    return {"model": TRAINED, "seed": seed, "context": context, "corpus_sha256": corpus_sha,
            "tokenizer_corpus_sha256": synth.corpus_texts()[1], "template_sha256": synth.template_sha256(),
            "recipe": dataclasses.asdict(recipe), "torch": torch.__version__}


def read_marker(path: Path) -> dict | None:
    """The marker of a trained checkpoint in `path`, or None where there is none."""
    marker = synth._read_json(Path(path) / synth.MARKER)
    return marker if marker is not None and marker.get("model") == TRAINED else None


def write_trained(out_dir: str | os.PathLike, seed: int = 0, context: int = synth.TINY_CONTEXT,
                  recipe: Recipe = RECIPE, log=None) -> Path:
    """Train `synthetic:trained` for `seed` into `out_dir` (its path), unless a checkpoint of the
    same seed, context, recipe, corpus, tokenizer and torch is already there. Another trained
    checkpoint there is replaced; any other non-empty folder is refused (it may hold user files)."""
    out = Path(out_dir)
    marker = read_marker(out)
    synth._check_target(out, ours=marker is not None)
    want = _marker(seed, context, corpus_sha256(recipe), recipe)
    if marker is not None and all(marker.get(k) == v for k, v in want.items()):
        return out

    def save(tmp: Path) -> None:
        model, tok_, stats = train(seed, context, recipe, log=log)
        bar = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            model.save_pretrained(tmp)
        finally:
            if bar:
                hf_logging.enable_progress_bar()
        tok_.save_pretrained(tmp)
        params = sum(p.numel() for p in model.parameters())
        (tmp / synth.MARKER).write_text(json.dumps({**want, "params": params,
                                                    **stats}, indent=2) + "\n")

    return synth._write_checkpoint(out, save)

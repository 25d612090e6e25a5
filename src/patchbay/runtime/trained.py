"""`synthetic:trained`: a small glm4_moe trained on Python standard-library sources until it copies
what it has seen in its context.

The other synthetic models have random weights: their replies are noise, so a drafter that guesses
the next tokens from the prompt can never be right, and a reply cannot be read for sense. This one
is trained on the interpreter's own library sources (nothing is downloaded) with the tokenizer of
`synthetic:tiny`, by the loop in `trainer` (see there for the batches that teach it to copy).

Two CPU cores are too slow to teach a model to copy, so the checkpoint of seed 0 is trained on a GPU
and shipped in the package (SHIPPED, bfloat16, with its tokenizer and training record):

1. `write_bundle(DIR)` here: the corpus as token ids, the trainer as a script and its launcher
   (scripts/train-trained-gpu.sh), plus the wheels the launcher names; the GPU machine needs
   neither tokenizer nor patchbay.
2. On the GPU: `DIR/train_gpu.sh OUT` (under four minutes on one H200, pip install included).
3. `ship(OUT)` here: checks the record against this tokenizer and writes SHIPPED.

`write_trained` installs SHIPPED (in float32, at the asked context) where its seed is asked for;
any other seed, or an explicit recipe, is trained on this machine's CPU (CPU_RECIPE: about eight
minutes on two cores, and it does not learn to copy in that time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sysconfig
from pathlib import Path

import torch
from transformers import GenerationConfig, Glm4MoeForCausalLM, PreTrainedTokenizerFast

from . import synth, trainer
from .trainer import Recipe, copy_accuracy

TRAINED = "synthetic:trained"
ROOT = Path(__file__).resolve().parents[3]
SHIPPED = Path(__file__).resolve().parent / "data" / "trained"
LAUNCHER = ROOT / "scripts" / "train-trained-gpu.sh"
SHIPPED_FILES = ("config.json", "generation_config.json", "model.safetensors", "training.json", "train.log")
SHIPPED_MAX_BYTES = 20_000_000
# What the shipped checkpoint was trained with (on a GPU): trainer.RECIPE.
RECIPE = trainer.RECIPE
# The WIP recipe that fits two CPU cores (1.35 M parameters, 1,200 steps of 16 x 256 tokens): used
# for seeds that ship no checkpoint.
CPU_RECIPE = dataclasses.replace(RECIPE, hidden=128, layers=2, heads=4, intermediate=256, moe_intermediate=64,
                                 batch=16, copies=5, shuffled=5, length=256, lr=3e-3, warmup=50, steps=1200,
                                 eval_every=100)
HELD_OUT = slice(120, 130)  # of library_files(): ten sources no recipe trains on
# Folders of the standard library that hold tests, generated tables or other installs' files.
SKIPPED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__", "encodings"}


def library_files() -> list[Path]:
    """Every top-level .py file of the standard library of at least 4,000 bytes, by name."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(root.glob("*.py")) if p.stat().st_size >= 4000]


def held_out_files() -> list[Path]:
    return library_files()[HELD_OUT]


def training_files() -> list[Path]:
    """Every .py file of the standard library outside SKIPPED_DIRS, by path, except those held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    held = set(held_out_files())
    return [p for p in sorted(root.rglob("*.py"))
            if not set(p.relative_to(root).parts[:-1]) & SKIPPED_DIRS and p not in held]


def corpus_sha256(files: list[Path]) -> str:
    """sha256 over the files' names (from the library's root) and bytes."""
    root = Path(sysconfig.get_paths()["stdlib"])
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def encode(tok, files: list[Path]) -> torch.Tensor:
    ids = []
    for path in files:
        ids.extend(tok.backend_tokenizer.encode(path.read_text(errors="replace"), add_special_tokens=False).ids)
    return torch.tensor(ids)


def tokenizer_sha256(tok) -> str:
    """sha256 of the tokenizer's vocabulary, merges and special tokens: what the weights' ids mean."""
    return hashlib.sha256(tok.backend_tokenizer.to_str().encode()).hexdigest()


def corpus_meta(tok, files: list[Path], context: int) -> dict[str, str]:
    """What trainer.train needs of the tokenizer and the corpus, as the corpus file's metadata."""
    return {"vocab_size": str(len(tok)), "stop": json.dumps(synth.stop_ids(tok)), "pad": str(tok.pad_token_id),
            "context": str(context), "corpus_sha256": corpus_sha256(files), "tokenizer_sha256": tokenizer_sha256(tok)}


def write_corpus(path: str | os.PathLike, context: int = synth.TINY_CONTEXT, files: list[Path] | None = None) -> Path:
    """The corpus file the trainer reads: training and held-out token ids (int16: the vocabulary
    has 4,000 entries) and corpus_meta."""
    from safetensors.torch import save_file

    tok = synth.build_tokenizer(0, context)
    files = training_files() if files is None else files
    tensors = {"train": encode(tok, files).to(torch.int16), "held": encode(tok, held_out_files()).to(torch.int16)}
    save_file(tensors, str(path), metadata=corpus_meta(tok, files, context))
    return Path(path)


def write_bundle(dest: str | os.PathLike) -> Path:
    """What a GPU machine needs to train the shipped checkpoint, but the wheels (LAUNCHER says
    which): corpus.safetensors, train_gpu.py (the trainer) and train_gpu.sh (the launcher)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    write_corpus(dest / "corpus.safetensors", context=65536)  # the served default's; no weight depends on it
    shutil.copyfile(trainer.__file__, dest / "train_gpu.py")
    shutil.copyfile(LAUNCHER, dest / "train_gpu.sh")
    os.chmod(dest / "train_gpu.sh", 0o755)
    return dest


def ship(src: str | os.PathLike, dest: str | os.PathLike = SHIPPED) -> Path:
    """Write the trainer's output `src` (a GPU run's OUT) with the tokenizer it was trained with
    into `dest`, refusing a run of another tokenizer or one over SHIPPED_MAX_BYTES."""
    src, dest = Path(src), Path(dest)
    record = json.loads((src / "training.json").read_text())
    tok = synth.build_tokenizer(record["seed"], int(record["context"]))
    if record["tokenizer_sha256"] != tokenizer_sha256(tok):
        raise ValueError(f"{src}: trained with another tokenizer (sha256 {record['tokenizer_sha256']}) than this "
                         f"interpreter's library builds ({tokenizer_sha256(tok)}); ship it from where its bundle was made")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.iterdir():
        old.unlink()
    for name in SHIPPED_FILES:
        shutil.copyfile(src / name, dest / name)
    tok.save_pretrained(dest)
    size = sum(p.stat().st_size for p in dest.iterdir())
    if size > SHIPPED_MAX_BYTES:
        raise ValueError(f"{dest}: {size:,} bytes, over the {SHIPPED_MAX_BYTES:,} a shipped checkpoint may take")
    return dest


def shipped_record(shipped: Path = SHIPPED) -> dict | None:
    """The training record of the shipped checkpoint, or None where none is shipped."""
    if not (shipped / "model.safetensors").is_file():
        return None
    return synth._read_json(shipped / "training.json")


def train(seed: int, context: int, recipe: Recipe = CPU_RECIPE, files: list[Path] | None = None, log=None):
    """Train on this machine's CPU: the model (float32, eval mode), its tokenizer, and the figures."""
    tok = synth.build_tokenizer(seed, context)
    files = training_files() if files is None else files
    meta = corpus_meta(tok, files, context)
    model, stats = trainer.train(encode(tok, files), encode(tok, held_out_files()), meta, recipe, seed=seed, log=log)
    return model, tok, {**stats, "corpus_sha256": meta["corpus_sha256"]}


def _marker(seed: int, context: int, source: dict) -> dict:
    return {"model": TRAINED, "seed": seed, "context": context, "template_sha256": synth.template_sha256(), **source}


def read_marker(path: Path) -> dict | None:
    """The marker of a trained checkpoint in `path`, or None where there is none."""
    marker = synth._read_json(Path(path) / synth.MARKER)
    return marker if marker is not None and marker.get("model") == TRAINED else None


def _save(model, tok, tmp: Path, marker: dict) -> None:
    synth.save_checkpoint(model, tok, tmp)
    (tmp / synth.MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _install(shipped: Path, tmp: Path, context: int, marker: dict, dtype: str = "float32") -> None:
    """The shipped checkpoint at `context`, its copy accuracy measured here in float32, saved in
    `dtype` (float32, as CPU serving wants it, unless said)."""
    model = Glm4MoeForCausalLM.from_pretrained(shipped, dtype=torch.float32).eval()
    model.config.max_position_embeddings = context  # no weight depends on it
    stop = model.config.eos_token_id
    tok = PreTrainedTokenizerFast.from_pretrained(shipped, model_max_length=context)
    tok.chat_template = synth.CHAT_TEMPLATE
    model.generation_config = GenerationConfig(do_sample=False, eos_token_id=stop, pad_token_id=tok.pad_token_id)
    record = json.loads((shipped / "training.json").read_text())
    figures = {k: record[k] for k in ("params", "steps", "final_loss", "train_seconds", "device") if k in record}
    accuracy = round(copy_accuracy(model, encode(tok, held_out_files())), 4)
    _save(model.to(getattr(torch, dtype)), tok, tmp, {**marker, **figures, "copy_accuracy_held_out": accuracy})


DTYPES = ("float32", "bfloat16")  # what write_trained saves: float32 for CPU serving, bfloat16 as GPUs serve


def write_trained(out_dir: str | os.PathLike, seed: int = 0, context: int = synth.TINY_CONTEXT,
                  recipe: Recipe | None = None, shipped: str | os.PathLike = SHIPPED, log=None,
                  dtype: str = "float32") -> Path:
    """`synthetic:trained` for `seed` into `out_dir` (its path): the shipped checkpoint where it is
    of that seed and no recipe is given, else trained here on the CPU (`recipe`, CPU_RECIPE unless
    given). A checkpoint already there from the same source, seed and context is kept; another
    trained checkpoint there is replaced; any other non-empty folder is refused (it may hold user files).
    `dtype` (one of DTYPES) is what the weights are saved in."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: expected one of {', '.join(DTYPES)}")
    out, shipped = Path(out_dir), Path(shipped)
    saved_as = {} if dtype == "float32" else {"dtype": dtype}  # float32 markers predate the choice
    marker = read_marker(out)
    synth._check_target(out, ours=marker is not None)
    record = shipped_record(shipped) if recipe is None else None
    if record is not None and record.get("seed") == seed:
        digest = hashlib.sha256((shipped / "model.safetensors").read_bytes()).hexdigest()
        want = _marker(seed, context, {"source": "shipped", "weights_sha256": digest, **saved_as})
        if marker is not None and all(marker.get(k) == v for k, v in want.items()):
            return out
        return synth._write_checkpoint(out, lambda tmp: _install(shipped, tmp, context, want, dtype))
    recipe = CPU_RECIPE if recipe is None else recipe
    files = training_files()
    want = _marker(seed, context, {"source": "cpu", "corpus_sha256": corpus_sha256(files),
                                   "tokenizer_corpus_sha256": synth.corpus_texts()[1],
                                   "recipe": dataclasses.asdict(recipe), "torch": torch.__version__, **saved_as})
    if marker is not None and all(marker.get(k) == v for k, v in want.items()):
        return out

    def save(tmp: Path) -> None:
        model, tok, stats = train(seed, context, recipe, files, log=log)
        stats.pop("history")
        params = sum(p.numel() for p in model.parameters())
        _save(model.to(getattr(torch, dtype)), tok, tmp, {**want, "params": params, **stats})

    return synth._write_checkpoint(out, save)

"""The training loop of `synthetic:trained`, standalone: it imports torch, transformers and
safetensors only, so it also runs as a script on a GPU machine that has no patchbay and no tokenizer:

    python3 trainer.py --corpus corpus.safetensors --out DIR [--seconds 150] [--device cuda]

The corpus file (token ids and what the model needs of its tokenizer) is written by
`patchbay.runtime.trained.write_bundle`, where the tokenizer is. DIR gets the checkpoint in bfloat16
(config.json, generation_config.json, model.safetensors: no tokenizer, `trained.ship` adds it),
training.json (the recipe, the run and its figures) and train.log.

Copying is what the model is for. Every batch mixes plain windows of text, windows where a span of
text is repeated, and windows where a span of tokens drawn at random is repeated: the last can only
be predicted by looking back for the previous showing and copying what followed, which is the
induction that prompt-lookup drafting and prefix reuse are measured on. Spans have random lengths,
so only copying by content predicts a repeat (a fixed period would teach a fixed look-back).

A run stops after `steps` steps, or, with steps 0, after the number of steps that fits `seconds`,
planned from the time of the first steps; training.json records the steps, and `--steps N` repeats a
run with the same schedule and batches (bit-equal on a CPU with the same thread count; on a GPU up
to the order of its atomic additions).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import platform
import time
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import GenerationConfig, Glm4MoeConfig, Glm4MoeForCausalLM
from transformers.utils import logging as hf_logging


@dataclasses.dataclass(frozen=True)
class Recipe:
    """The model's shape and how it is trained; every field goes into the record (and the marker)."""

    # tiny's features (dense first layer, shared and routed experts, GQA, partial rotary, q/k/v
    # biases) wider and deeper: 6.25 M parameters with the 4,000-token vocabulary, 12.5 MB as bf16.
    hidden: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 768  # the dense first layer's MLP
    experts: int = 4  # routed, two a token, beside one shared expert
    moe_intermediate: int = 256
    batch: int = 32  # sequences a step
    copies: int = 10  # of them a span of text repeated to the length
    shuffled: int = 10  # of them a span of the corpus's tokens drawn at random, repeated to the length
    min_span: int = 16  # the shortest span repeated (the longest: half the length)
    length: int = 2048  # tokens a sequence: copies reach back up to half of it
    lr: float = 2e-3
    final_lr: float = 0.1  # of lr, where the cosine ends
    warmup: int = 150  # steps of linear warm-up
    weight_decay: float = 0.1
    clip: float = 1.0
    bf16: bool = True  # autocast on a GPU (the weights and the optimizer stay float32)
    steps: int = 0  # 0: as many as fit `seconds`
    seconds: float = 150.0
    eval_every: int = 100
    threads: int = 2  # torch CPU threads when training on a CPU: the reduction order, so the bits


RECIPE = Recipe()


def model_config(vocab_size: int, stop: list[int], pad: int, context: int, recipe: Recipe = RECIPE) -> Glm4MoeConfig:
    return Glm4MoeConfig(
        vocab_size=vocab_size,
        hidden_size=recipe.hidden,
        num_hidden_layers=recipe.layers,
        first_k_dense_replace=1,
        num_attention_heads=recipe.heads,
        num_key_value_heads=recipe.kv_heads,
        head_dim=recipe.head_dim,
        intermediate_size=recipe.intermediate,
        n_routed_experts=recipe.experts,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=recipe.moe_intermediate,
        partial_rotary_factor=0.5,
        max_position_embeddings=context,  # no weight depends on it
        attention_bias=True,
        initializer_range=0.02,
        tie_word_embeddings=False,
        num_mtp_layers=0,
        eos_token_id=stop,
        pad_token_id=pad,
        dtype="float32",
    )


def batch(tokens: torch.Tensor, generator: torch.Generator, recipe: Recipe = RECIPE) -> torch.Tensor:
    """One batch of `batch` rows of `length` tokens: plain windows of text, then `copies` rows of a
    span of text repeated to the length, then `shuffled` rows of a span of the corpus's tokens drawn
    at random, repeated. Each span's length is drawn from min_span to half the length."""
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


def copy_accuracy(model, tokens: torch.Tensor, spans: int = 32, half: int = 64) -> float:
    """How often the model's top token is the right one in the second showing of a span it has
    just read (teacher-forced, spans of `half` tokens of `tokens`, evenly spaced)."""
    step = max(1, (len(tokens) - half) // spans)
    seqs = torch.stack([tokens[i * step:i * step + half].repeat(2) for i in range(spans)])
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=seqs.to(device)).logits
    guess = logits[:, half - 1:-1].argmax(-1).cpu()
    return (guess == seqs[:, half:]).float().mean().item()


def read_corpus(path: str | Path) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(training ids, held-out ids, metadata) of a corpus file written by trained.write_corpus."""
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        return f.get_tensor("train").long(), f.get_tensor("held").long(), meta


def train(tokens: torch.Tensor, held: torch.Tensor, meta: dict, recipe: Recipe = RECIPE, seed: int = 0,
          device: str = "cpu", log=None):
    """The trained model (float32, in eval mode, on `device`) and the figures of the run."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    threads = torch.get_num_threads()
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = True  # the float32 evaluations; training is in bf16
    else:
        torch.set_num_threads(recipe.threads)
    try:
        torch.manual_seed(seed)  # the initial weights are made on the CPU: the same on any device
        stop = json.loads(meta["stop"])
        model = Glm4MoeForCausalLM(model_config(int(meta["vocab_size"]), stop, int(meta["pad"]),
                                                int(meta["context"]), recipe))
        # The experts' plain loop: its matmuls follow autocast (grouped_mm would run float32 there).
        model.set_experts_implementation("eager")
        model.to(device)
        model.generation_config = GenerationConfig(do_sample=False, eos_token_id=stop, pad_token_id=int(meta["pad"]))
        generator = torch.Generator().manual_seed(seed)
        optim = torch.optim.AdamW(model.parameters(), lr=recipe.lr, betas=(0.9, 0.95),
                                  weight_decay=recipe.weight_decay, **({"fused": True} if on_gpu else {}))
        plan = {"steps": recipe.steps or None}

        def rate(step: int) -> float:
            if step < recipe.warmup:
                return (step + 1) / recipe.warmup
            if plan["steps"] is None:
                return 1.0
            done = min(1.0, (step - recipe.warmup) / max(1, plan["steps"] - recipe.warmup))
            return recipe.final_lr + (1 - recipe.final_lr) * 0.5 * (1 + math.cos(math.pi * done))

        schedule = torch.optim.lr_scheduler.LambdaLR(optim, rate)
        model.train()
        began, mark, step, loss, history = time.monotonic(), None, 0, torch.tensor(float("nan")), []
        while plan["steps"] is None or step < plan["steps"]:
            ids = batch(tokens, generator, recipe)
            ids = ids.pin_memory().to(device, non_blocking=True) if on_gpu else ids
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=on_gpu and recipe.bf16):
                loss = model(input_ids=ids, labels=ids).loss
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.clip)
            optim.step()
            schedule.step()
            step += 1
            if plan["steps"] is None:
                # Plan the run from steps 5 to 25 (the first ones warm the device up), leaving a
                # twentieth of the budget for the evaluations.
                if step == 5:
                    loss.item()  # waits for the device
                    mark = time.monotonic()
                elif step == 25:
                    loss.item()
                    per_step = (time.monotonic() - mark) / 20
                    left = 0.95 * recipe.seconds - (time.monotonic() - began)
                    plan["steps"] = max(step + 1, step + int(left / per_step))
                    if log:
                        log(f"{per_step * 1000:.0f} ms a step ({recipe.batch * recipe.length / per_step:,.0f} tokens/s): "
                            f"{plan['steps']} steps planned in {recipe.seconds:.0f} s")
            if step % recipe.eval_every == 0 or step == plan["steps"]:
                model.eval()
                copying = copy_accuracy(model, held)
                model.train()
                history.append({"step": step, "loss": round(loss.item(), 4), "copy_accuracy": round(copying, 4),
                                "seconds": round(time.monotonic() - began, 1)})
                if log:
                    log(f"step {step}: loss {loss.item():.3f}, copies {copying:.3f} of held-out tokens "
                        f"({time.monotonic() - began:.0f} s)")
            if recipe.steps == 0 and time.monotonic() - began > 1.2 * recipe.seconds:
                if log:
                    planned = plan["steps"] or "those not yet planned"
                    log(f"stopped at step {step} of {planned}: past 1.2 x {recipe.seconds:.0f} s")
                break
        model.eval()
        stats = {"steps": step, "final_loss": round(loss.item(), 4),
                 "copy_accuracy_held_out": round(copy_accuracy(model, held), 4),
                 "train_seconds": round(time.monotonic() - began, 1), "train_tokens": len(tokens),
                 "tokens_seen": step * recipe.batch * recipe.length, "history": history}
    finally:
        torch.set_num_threads(threads)
    return model, stats


def save(model, out: Path, record: dict, held: torch.Tensor) -> dict:
    """Write the model in bfloat16 and its record into `out`; the record gains the copy accuracy of
    the written weights (read back in float32)."""
    out.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    model.to(torch.bfloat16).save_pretrained(out)
    again = Glm4MoeForCausalLM.from_pretrained(out, dtype=torch.float32).to(device).eval()
    record = {**record, "copy_accuracy_saved_bf16": round(copy_accuracy(again, held), 4)}
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", required=True, help="the corpus file trained.write_bundle wrote")
    p.add_argument("--out", required=True, help="where the checkpoint and its record go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seconds", type=float, help=f"training budget (default {RECIPE.seconds:.0f})")
    p.add_argument("--steps", type=int, help="exactly this many steps (repeats a run), ignoring --seconds")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="another value for a recipe field (a small run on a CPU, say)")
    args = p.parse_args(argv)
    kinds = {f.name: type(getattr(RECIPE, f.name)) for f in dataclasses.fields(Recipe)}
    changes = {}
    for item in args.set:
        name, _, value = item.partition("=")
        if name not in kinds:
            p.error(f"--set {item}: no recipe field {name} (fields: {', '.join(kinds)})")
        changes[name] = value.lower() in ("1", "true") if kinds[name] is bool else kinds[name](value)
    if args.seconds is not None:
        changes["seconds"] = args.seconds
    if args.steps is not None:
        changes["steps"] = args.steps
    recipe = dataclasses.replace(RECIPE, **changes)
    hf_logging.disable_progress_bar()  # the log is read afterwards
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.log", "w") as logfile:
        def log(line: str) -> None:
            print(line, flush=True)
            logfile.write(line + "\n")
            logfile.flush()

        tokens, held, meta = read_corpus(args.corpus)
        where = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else platform.processor() or "cpu"
        import transformers

        log(f"{len(tokens):,} training tokens, {len(held):,} held out; {where}, torch {torch.__version__}, "
            f"transformers {transformers.__version__} ({Path(transformers.__file__).parent}); "
            f"recipe {json.dumps(dataclasses.asdict(recipe))}")
        model, stats = train(tokens, held, meta, recipe, seed=args.seed, device=args.device, log=log)
        record = {"seed": args.seed, "recipe": dataclasses.asdict(recipe), "device": where,
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "params": sum(p.numel() for p in model.parameters()),
                  "corpus_sha256": meta["corpus_sha256"], "tokenizer_sha256": meta["tokenizer_sha256"],
                  "vocab_size": int(meta["vocab_size"]), "context": int(meta["context"]),
                  **stats}
        record = save(model, out, record, held)
        log(f"done: {record['steps']} steps, loss {record['final_loss']}, copies {record['copy_accuracy_held_out']} "
            f"of held-out tokens ({record['copy_accuracy_saved_bf16']} as saved in bf16), {record['params']:,} "
            f"parameters; wrote {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

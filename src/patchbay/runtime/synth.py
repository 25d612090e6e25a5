"""Synthetic checkpoints: a seeded tiny glm4_moe for tests, and GLM-4.5-Air shapes for benchmarks.

Nothing here downloads anything. The tokenizer is trained on Python standard-library sources that
every interpreter ships, so a checkpoint can be rebuilt anywhere from its seed alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
import tempfile
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GenerationConfig, Glm4MoeConfig, Glm4MoeForCausalLM, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

# Order matters: ids are assigned in this order, after the BPE vocabulary (as GLM does).
SPECIAL_TOKENS = (
    "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>",
    "<arg_value>", "</arg_value>", "<tool_response>", "</tool_response>", "<|endoftext|>",
)  # fmt: skip
EOS = "<|endoftext|>"
# GLM stops a reply at end of text, or when the model starts the next user or tool turn.
STOP_TOKENS = (EOS, "<|user|>", "<|observation|>")
VOCAB_SIZE = 4000
MARKER = "patchbay-synth.json"
TINY = "synthetic:tiny"
# The test model's context (tests that meet the context limit build prompts past it). The served
# default's context is Config.synth_context; no weight depends on it, so the weights are the same.
TINY_CONTEXT = 512

# Plain-Python modules present in every CPython 3.x install and rarely rewritten. A different
# interpreter may still ship different text; corpus_sha256 in the marker makes that visible.
CORPUS_FILES = tuple(sorted((
    "argparse.py", "base64.py", "bisect.py", "calendar.py", "contextlib.py", "copy.py", "csv.py",
    "dataclasses.py", "difflib.py", "enum.py", "fnmatch.py", "fractions.py", "functools.py",
    "gettext.py", "glob.py", "heapq.py", "json/__init__.py", "json/decoder.py", "json/encoder.py",
    "operator.py", "pprint.py", "queue.py", "random.py", "sched.py", "shlex.py", "stat.py",
    "statistics.py", "string.py", "tempfile.py", "textwrap.py", "timeit.py", "tokenize.py",
    "weakref.py",
)))  # fmt: skip

# GLM-4.5 chat format. Turns follow each other with no separator and each role tag is followed by a
# newline. transformers renders templates with trim_blocks and lstrip_blocks, which eat newlines
# next to tags, so every newline that matters is written inside a string. `text` takes a string, a
# list of {"type": "text"} parts, or None (renders as empty).
CHAT_TEMPLATE = r"""{#- patchbay's GLM-4.5-style chat template -#}
{%- macro text(c) -%}
  {%- if c is string -%}{{ c }}
  {%- elif c is iterable and c is not mapping -%}
    {%- for part in c if part.type == 'text' -%}{{ part.text }}{%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- macro value(v) -%}{{ v if v is string else v | tojson }}{%- endmacro -%}

{{- '[gMASK]<sop>' -}}
{%- if tools -%}
  {{- '<|system|>\n# Tools\n\n'
      ~ 'You can call the functions below to help answer the user. '
      ~ 'Their JSON descriptions, one per line:\n<tools>\n' -}}
  {%- for tool in tools -%}{{ tool | tojson ~ '\n' }}{%- endfor -%}
  {{- '</tools>\n\n'
      ~ 'To call a function, write one block per call, with one key and value pair per argument:\n'
      ~ '<tool_call>FUNCTION NAME\n<arg_key>ARGUMENT NAME</arg_key>\n'
      ~ '<arg_value>ARGUMENT VALUE</arg_value>\n</tool_call>\n'
      ~ 'Write string values as they are and any other value as JSON.' -}}
{%- endif -%}

{#- Thinking of past assistant turns is kept only after the last user message (GLM's
    interleaved thinking), or for every turn when clear_thinking is false. -#}
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- set keep_all = clear_thinking is defined and not clear_thinking -%}

{%- for m in messages -%}
  {%- if m.role == 'system' or m.role == 'user' -%}
    {{- '<|' ~ m.role ~ '|>\n' ~ text(m.content) -}}
  {%- elif m.role == 'assistant' -%}
    {{- '<|assistant|>' -}}
    {%- if m.reasoning_content and (keep_all or loop.index0 > ns.last_user) -%}
      {{- '\n<think>' ~ m.reasoning_content ~ '</think>' -}}
    {%- else -%}
      {{- '\n<think></think>' -}}
    {%- endif -%}
    {%- set body = text(m.content) -%}
    {%- if body -%}{{ '\n' ~ body }}{%- endif -%}
    {%- for call in m.tool_calls or [] -%}
      {%- set f = call.function if call.function is defined else call -%}
      {{- '\n<tool_call>' ~ f.name ~ '\n' -}}
      {%- if f.arguments is mapping -%}
        {%- for k, v in f.arguments.items() -%}
          {{- '<arg_key>' ~ k ~ '</arg_key>\n<arg_value>' ~ value(v) ~ '</arg_value>\n' -}}
        {%- endfor -%}
      {%- elif f.arguments -%}{{ f.arguments ~ '\n' }}{#- a JSON string: passed through -#}
      {%- endif -%}
      {{- '</tool_call>' -}}
    {%- endfor -%}
  {%- elif m.role == 'tool' -%}
    {#- consecutive tool results share one observation turn -#}
    {%- if loop.first or loop.previtem.role != 'tool' -%}{{ '<|observation|>' }}{%- endif -%}
    {{- '\n<tool_response>' ~ text(m.content) ~ '</tool_response>' -}}
  {%- endif -%}
{%- endfor -%}

{%- if add_generation_prompt -%}
  {{- '<|assistant|>' -}}
  {%- if enable_thinking is defined and not enable_thinking -%}{{ '\n<think></think>' }}{%- endif -%}
{%- endif -%}
"""


def corpus_texts() -> tuple[list[str], str]:
    """The training texts in a fixed order, and a sha256 over their names and contents."""
    root = Path(sysconfig.get_paths()["stdlib"])
    digest = hashlib.sha256()
    texts = []
    for name in CORPUS_FILES:
        data = (root / name).read_bytes()
        digest.update(name.encode() + b"\0" + data + b"\0")
        texts.append(data.decode("utf-8"))
    return texts, digest.hexdigest()


def build_tokenizer(seed: int = 0, context: int = TINY_CONTEXT) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the stdlib corpus, with the GLM special tokens and chat template.

    BPE training has no randomness, so `seed` changes nothing; it is accepted so every builder
    here takes the same arguments. `context` is the model's, as the tokenizer's model_max_length
    (longer texts would warn on encode).
    """
    del seed
    texts, _ = corpus_texts()
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte encodes, nothing is <unk>
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer, length=len(texts))
    bpe.add_special_tokens(list(SPECIAL_TOKENS))  # ids follow the BPE vocabulary, in this order
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS,
        pad_token=EOS,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t != EOS],
        clean_up_tokenization_spaces=False,  # decode must give back the exact text
        model_max_length=context,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def padded_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """build_tokenizer() with filler entries up to vocab_size, so that every id a wide model
    (air12: 151,552) can emit decodes to text. Encoding is unchanged: no merge produces a filler."""
    tok = build_tokenizer()
    data = json.loads(tok.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    taken = set(vocab.values()) | {t["id"] for t in data["added_tokens"]}
    for i in range(vocab_size):
        if i not in taken:
            vocab[f"~{i}~"] = i  # plain ASCII, so the byte-level decoder maps it to itself
    padded = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)),
        eos_token=EOS,
        pad_token=EOS,
        extra_special_tokens=[t for t in SPECIAL_TOKENS if t != EOS],
        clean_up_tokenization_spaces=False,
    )
    padded.chat_template = CHAT_TEMPLATE
    return padded


def stop_ids(tok: PreTrainedTokenizerFast) -> list[int]:
    return tok.convert_tokens_to_ids(list(STOP_TOKENS))


def tiny_config(vocab_size: int, stop: list[int] | None = None, pad: int | None = None,
                context: int = TINY_CONTEXT) -> Glm4MoeConfig:
    """Every glm4_moe feature the engine meets in GLM-4.5 (dense first layer, shared and routed
    experts, GQA, partial rotary), shrunk until it generates in milliseconds per token on a CPU.

    `stop` and `pad` default to the ids `build_tokenizer` assigns (the specials sit at the end).
    """
    specials = {t: vocab_size - len(SPECIAL_TOKENS) + i for i, t in enumerate(SPECIAL_TOKENS)}
    stop = list(stop) if stop is not None else [specials[t] for t in STOP_TOKENS]
    return Glm4MoeConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=128,
        n_routed_experts=8,
        num_experts_per_tok=2,
        n_shared_experts=1,
        moe_intermediate_size=32,
        partial_rotary_factor=0.5,
        max_position_embeddings=context,  # no parameter depends on it: same weights at any context
        attention_bias=True,  # as in GLM-4.5, so loaders and TP plans meet q/k/v biases
        # The default init (std 0.02) already gives varied, prompt-dependent greedy text here
        # (logit top-1 margins ~0.04, far above float noise); tests/runtime/test_synth.py checks it.
        initializer_range=0.02,
        tie_word_embeddings=False,
        num_mtp_layers=0,  # no MTP weights are written, so none may be looked for
        eos_token_id=stop,
        pad_token_id=specials[EOS] if pad is None else pad,
        dtype="float32",
    )


def air12_config() -> Glm4MoeConfig:
    """GLM-4.5-Air layer shapes cut to 12 layers: 27.24 B parameters (3.78 B active per token).

    Open choices, taken from GLM-4.5-Air itself: untied lm_head (its 0.62 B count towards the
    27.24 B; tied would give 26.62 B), q/k/v biases, no q/k norm, rope_theta 1e6.
    """
    return air_config(12)


def air24_config() -> Glm4MoeConfig:
    """The same shapes with 24 layers (55.34 B parameters, 111 GB of bf16): with a KV pool it
    needs two H200s, for tensor-parallel measurements."""
    return air_config(24)


AIR_CONFIGS = {"air12": air12_config, "air24": air24_config}


def air_config(layers: int) -> Glm4MoeConfig:
    """GLM-4.5-Air's layer shapes with `layers` layers (the first dense, the rest MoE)."""
    return Glm4MoeConfig(
        vocab_size=151552,
        hidden_size=4096,
        num_hidden_layers=layers,
        first_k_dense_replace=1,
        intermediate_size=10944,
        num_attention_heads=96,
        num_key_value_heads=8,
        head_dim=128,
        n_routed_experts=128,
        num_experts_per_tok=8,
        n_shared_experts=1,
        moe_intermediate_size=1408,
        partial_rotary_factor=0.5,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5},
        max_position_embeddings=131072,
        attention_bias=True,
        use_qk_norm=False,
        tie_word_embeddings=False,
        num_mtp_layers=0,
        eos_token_id=[151329, 151336, 151338],  # GLM-4.5's <|endoftext|> <|user|> <|observation|>
        pad_token_id=151329,
        dtype="bfloat16",
    )


def count_params(config: Glm4MoeConfig) -> int:
    """Parameters of the model `config` describes, counted without allocating any."""
    with torch.device("meta"):
        model = Glm4MoeForCausalLM(config)
    return sum(p.numel() for p in model.parameters())


def build_air12(device: str | torch.device = "cuda", seed: int = 0, config: Glm4MoeConfig | None = None
                ) -> Glm4MoeForCausalLM:
    """The air12 benchmark model, initialised in bf16 straight on `device` (54 GB, no files).

    torch.manual_seed seeds the device's generator too, and each tensor is allocated and filled
    in place on the device, one at a time (the largest, an MoE layer's gate_up_proj, is 3 GB), so
    the host never holds a weight and the same seed gives the same model. On an H200 it builds in
    about a second.
    """
    torch.manual_seed(seed)
    with torch.device(device):
        model = Glm4MoeForCausalLM._from_config(config or air12_config(), dtype=torch.bfloat16)
    return model.eval()


def spread_layers(model) -> list[str]:
    """Move the decoder layers of a model built on one GPU over every visible GPU, in equal runs
    (the embedding, final norm and head stay). Upstream's save_pretrained first makes a
    converted copy of every weight on the weight's own device, so one GPU cannot save a model
    larger than half its memory (air24: 111 GB); spread over two, each holds half and its copy.
    Returns the devices in layer order; the values are unchanged."""
    import torch

    layers = model.model.layers
    count = torch.cuda.device_count() if model.device.type == "cuda" else 1
    if count < 2:
        return [str(model.device)] * len(layers)
    per = -(-len(layers) // count)
    for i, layer in enumerate(layers):
        layer.to(f"cuda:{i // per}")
    return [f"cuda:{i // per}" for i in range(len(layers))]


def write_air(out_dir: str | os.PathLike, name: str = "air12", seed: int = 0, device: str = "cuda",
              config: Glm4MoeConfig | None = None) -> Path:
    """Write an air model (air12, air24) as a checkpoint, for servers that load models by path
    (tensor parallelism: every rank loads its part). The weights are exactly build_air12's for
    the seed (built on `device`, spread over every GPU, then saved in 5 GB shards), with the padded tokenizer and its
    chat template. An existing checkpoint of the same name and seed is kept; a non-empty folder
    that is not one of ours is refused. `config` overrides the shapes (tests)."""
    out = Path(out_dir)
    marker = _read_json(out / MARKER)
    label = f"synthetic:{name}"
    _check_target(out, ours=marker is not None and str(marker.get("model", "")).startswith("synthetic:air"))
    if marker and marker.get("model") == label and marker.get("seed") == seed:
        return out
    config = config or AIR_CONFIGS[name]()

    def save(tmp: Path) -> None:
        model = build_air12(device, seed, config)
        spread_layers(model)
        model.generation_config = GenerationConfig(do_sample=False, eos_token_id=config.eos_token_id,
                                                   pad_token_id=config.pad_token_id)
        model.save_pretrained(tmp, max_shard_size="5GB")
        params = sum(p.numel() for p in model.parameters())
        del model
        padded_tokenizer(config.vocab_size).save_pretrained(tmp)
        (tmp / MARKER).write_text(json.dumps({"model": label, "seed": seed, "params": params,
                                              "template_sha256": template_sha256()}, indent=2) + "\n")

    return _write_checkpoint(out, save)


def _write_checkpoint(out: Path, save) -> Path:
    """save(tmp) writes a checkpoint, marker included, into a folder next to `out`; its files
    then move in with the marker last: an interrupted write leaves no marker, so it can never be
    mistaken for a finished checkpoint."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        save(Path(tmp))
        out.mkdir(exist_ok=True)
        (out / MARKER).unlink(missing_ok=True)
        for name in sorted(os.listdir(tmp), key=lambda n: n == MARKER):
            os.chmod(Path(tmp) / name, 0o644)  # safetensors writes 0600; a server may run as another user
            os.replace(Path(tmp) / name, out / name)
    return out


def _read_json(path: Path) -> dict | None:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _check_target(out: Path, ours: bool) -> None:
    """A checkpoint goes into a new or empty folder, or over one of our own of the same family
    (`ours`: its marker says so); anything else may hold user files and is refused."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out}: exists and is not a directory; pass a new or empty directory")
    if out.is_dir() and any(out.iterdir()) and not ours:
        raise ValueError(
            f"{out}: directory is not empty and is not a patchbay synthetic checkpoint of this kind "
            f"(no matching {MARKER}); pass a new or empty directory"
        )


def template_sha256() -> str:
    return hashlib.sha256(CHAT_TEMPLATE.encode()).hexdigest()


def _marker(seed: int, corpus_sha256: str, params: int, context: int) -> dict:
    return {"model": TINY, "seed": seed, "corpus_sha256": corpus_sha256, "params": params,
            "template_sha256": template_sha256(), "context": context}


def read_marker(path: Path) -> dict | None:
    """The synth marker in checkpoint dir `path`, or None if it is not a synth checkpoint."""
    marker = _read_json(Path(path) / MARKER)
    return marker if marker is not None and marker.get("model") == TINY else None


def _save_tiny(out: Path, seed: int, context: int) -> None:
    tok = build_tokenizer(seed, context)
    stop = stop_ids(tok)
    config = tiny_config(len(tok), stop=stop, pad=tok.pad_token_id, context=context)
    torch.manual_seed(seed)
    model = Glm4MoeForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        do_sample=False, eos_token_id=stop, pad_token_id=tok.pad_token_id
    )
    save_checkpoint(model, tok, out)
    params = sum(p.numel() for p in model.parameters())
    marker = _marker(seed, corpus_texts()[1], params, context)
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def write_tiny(out_dir: str | os.PathLike, seed: int = 0, context: int = TINY_CONTEXT) -> Path:
    """Write the `synthetic:tiny` checkpoint for `seed` and `context` into `out_dir`; its path.

    An existing checkpoint for the same seed, corpus and context is returned as is. A synth
    checkpoint of another seed or context is replaced. Any other non-empty directory is refused:
    it may hold user files.
    """
    out = Path(out_dir)
    marker = read_marker(out)
    _check_target(out, ours=marker is not None)
    if (marker and marker.get("seed") == seed and marker.get("corpus_sha256") == corpus_texts()[1]
            and marker.get("template_sha256") == template_sha256() and marker.get("context", 512) == context):
        return out
    return _write_checkpoint(out, lambda tmp: _save_tiny(tmp, seed, context))


def save_checkpoint(model, tok, out: Path) -> None:
    """The model and its tokenizer into `out`, without the progress bar a one-shard write needs
    not; the model in GLM's on-disk layout (one tensor per expert), sorted, with fixed metadata."""
    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(out)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    tok.save_pretrained(out)

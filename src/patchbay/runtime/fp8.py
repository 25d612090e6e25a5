"""FP8 checkpoints in the format of GLM-4.5's FP8 releases, made from a synthetic checkpoint.

The releases store every linear weight of the decoder layers (attention q/k/v/o, the dense MLP,
the shared and the routed experts, one tensor per expert) as float8 e4m3 with one float32
`weight_scale_inv` per 128 x 128 block, the last block of a ragged dimension partly empty;
the true weight is `float(q) * scale_inv`. Embeddings, the output head, norms and the router
stay in the model's dtype. The config says so under `quantization_config`.

`write_fp8` makes such a checkpoint from one of ours (`synthetic:trained-fp8` is
`synthetic:trained` quantized), `write_dequantized` its dequantized twin: the same checkpoint
expanded back to the model's dtype, as upstream's load-time dequantization expands it. A server
with PB_FP8_WEIGHTS (0810) computes what the twin computes, bit for bit; the twin against the
source measures what quantization costs.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from . import synth

BLOCK = (128, 128)
E4M3_MAX = 448.0
QUANTIZATION_CONFIG = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                       "weight_block_size": list(BLOCK)}
# The weights a release quantizes, by checkpoint name (GLM's on-disk layout, one tensor per expert).
QUANTIZED = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj"
                       r"|mlp\.(experts\.\d+\.|shared_experts\.)?(gate|up|down)_proj)\.weight$")
# What travels with the weights unchanged.
SIDE_FILES = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "special_tokens_map.json")


def quantize(weight: torch.Tensor, block: tuple[int, int] = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight (..., rows, cols) as e4m3 values and one float32 scale per block of its last two
    dimensions: each block's largest magnitude maps to e4m3's largest finite value (448), an
    all-zero block gets scale 1. Stacks (experts) go a few matrices at a time, so the float32
    working copy stays small next to the weight."""
    stack = weight.reshape(-1, *weight.shape[-2:])
    parts = [_quantize_stack(part, block) for part in stack.split(8)]
    q, scale = torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])
    return q.view(weight.shape), scale.view(*weight.shape[:-2], *scale.shape[-2:])


def _quantize_stack(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    n, rows, cols = weight.shape
    br, bc = block
    grid = (-(-rows // br), -(-cols // bc))
    padded = torch.zeros(n, grid[0] * br, grid[1] * bc, dtype=torch.float32, device=weight.device)
    padded[:, :rows, :cols] = weight.to(torch.float32)
    blocks = padded.view(n, grid[0], br, grid[1], bc)
    amax = blocks.abs().amax(dim=(2, 4))
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = (blocks / scale[:, :, None, :, None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(n, grid[0] * br, grid[1] * bc)[:, :rows, :cols].contiguous(), scale.contiguous()


def dequantize(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, block: tuple[int, int] = BLOCK
               ) -> torch.Tensor:
    """`float(q) * scale` per block, rounded once to `dtype` (upstream's load-time arithmetic)."""
    rows, cols = q.shape
    s = scale.to(torch.float32).repeat_interleave(block[0], 0)[:rows].repeat_interleave(block[1], 1)[:, :cols]
    return (q.to(torch.float32) * s).to(dtype)


def _tensors(src: Path) -> dict[str, torch.Tensor]:
    out = {}
    for path in sorted(src.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            for key in f.keys():
                out[key] = f.get_tensor(key)
    if not out:
        raise ValueError(f"{src}: no *.safetensors files")
    return out


def _copy_side_files(src: Path, out: Path) -> None:
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)


def write_fp8(src: str | Path, out: str | Path, label: str) -> Path:
    """Checkpoint `src` quantized into `out` in the release format; `label` names it in the marker.
    An existing checkpoint of the same label made from the same source is kept."""
    src, out = Path(src), Path(out)
    source_marker = synth._read_json(src / synth.MARKER) or {}
    marker = {"model": label, "source": source_marker, "quantization_config": QUANTIZATION_CONFIG}
    existing = synth._read_json(out / synth.MARKER)
    synth._check_target(out, ours=existing is not None and existing.get("model") == label)
    if existing == marker:
        return out

    def save(tmp: Path) -> None:
        tensors = {}
        for key, value in _tensors(src).items():
            if QUANTIZED.match(key):
                q, scale = quantize(value)
                tensors[key] = q
                tensors[key.removesuffix("weight") + "weight_scale_inv"] = scale
            else:
                tensors[key] = value
        save_file(dict(sorted(tensors.items())), tmp / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((src / "config.json").read_text())
        config["quantization_config"] = QUANTIZATION_CONFIG
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        _copy_side_files(src, tmp)
        (tmp / synth.MARKER).write_text(json.dumps(marker, indent=2) + "\n")

    return synth._write_checkpoint(out, save)


def write_dequantized(src: str | Path, out: str | Path) -> Path:
    """FP8 checkpoint `src` expanded to its model's dtype into `out`: the twin a PB_FP8_WEIGHTS
    server matches bit for bit. Always rewritten (a test's scratch folder)."""
    src, out = Path(src), Path(out)
    config = json.loads((src / "config.json").read_text())
    quant = config.pop("quantization_config")
    block = tuple(quant["weight_block_size"])
    dtype = getattr(torch, config.get("dtype") or config.get("torch_dtype") or "bfloat16")
    tensors = _tensors(src)
    plain = {}
    for key, value in tensors.items():
        if key.endswith("weight_scale_inv"):
            continue
        scale = tensors.get(key.removesuffix("weight") + "weight_scale_inv")
        plain[key] = value if scale is None else dequantize(value, scale, dtype, block)
    out.mkdir(parents=True, exist_ok=True)
    save_file(dict(sorted(plain.items())), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    _copy_side_files(src, out)
    return out


def convert_layer(layer, config, block: tuple[int, int] = BLOCK, prefix: str = "model.layers.0") -> int:
    """Decoder layer `layer` quantized in memory into upstream's FP8 modules, as loading its FP8
    checkpoint builds them (every weight `QUANTIZED` names under `prefix`; the routed experts'
    stacks [experts, 2 x inter, hidden] and [experts, hidden, inter] per expert matrix). The bf16
    weights are dropped as each module is replaced. Needs the engine's transformers; returns how
    many modules were replaced. Experts whose width is not a whole number of blocks are refused:
    a checkpoint of them cannot be loaded either (gate and up are quantized apart, and their
    fused scale grid would not line up)."""
    from torch import nn
    from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS, FP8Experts, FP8Linear
    from transformers.integrations.moe import use_experts_implementation

    replaced = 0
    for name, module in list(layer.named_modules()):
        if not name:
            continue
        parent = layer.get_submodule(name.rpartition(".")[0]) if "." in name else layer
        child = name.rpartition(".")[2]
        if type(module) is nn.Linear and QUANTIZED.match(f"{prefix}.{name}.weight"):
            q, scale = quantize(module.weight.data, block)
            with torch.device("meta"):
                new = FP8Linear(module.in_features, module.out_features, block_size=list(block),
                                has_bias=module.bias is not None)
            new.weight = nn.Parameter(q, requires_grad=False)
            new.weight_scale_inv = nn.Parameter(scale, requires_grad=False)
            if module.bias is not None:
                new.bias = nn.Parameter(module.bias.data, requires_grad=False)
        elif child == "experts" and hasattr(module, "gate_up_proj") and hasattr(module, "down_proj"):
            inter = module.down_proj.shape[-1]
            if inter % block[0]:
                raise ValueError(f"{prefix}.{name}: experts {inter} wide are not a whole number of {block[0]}-row "
                                 "blocks; FP8 checkpoints of them do not load")
            cls = use_experts_implementation(experts_class=FP8Experts, experts_interface=ALL_FP8_EXPERTS_FUNCTIONS,
                                             has_bias=False, has_gate=True)
            with torch.device("meta"):
                new = cls(config=config, block_size=list(block))
            for weight in ("gate_up_proj", "down_proj"):
                q, scale = quantize(getattr(module, weight).data, block)
                setattr(new, weight, nn.Parameter(q, requires_grad=False))
                setattr(new, f"{weight}_scale_inv", nn.Parameter(scale, requires_grad=False))
        else:
            continue
        setattr(parent, child, new)
        del module
        replaced += 1
    return replaced


def convert_model(model, block: tuple[int, int] = BLOCK) -> int:
    """Every decoder layer of glm4_moe `model` quantized in memory (convert_layer); the model is then
    what loading its FP8 checkpoint gives. Returns how many modules were replaced."""
    return sum(convert_layer(layer, model.config, block, f"model.layers.{i}")
               for i, layer in enumerate(model.model.layers))


def build_air_fp8(device: str | torch.device = "cuda", seed: int = 0, config=None):
    """GLM-4.5-Air's full geometry (46 layers, about 106 B parameters) in FP8, built on `device` one
    decoder layer at a time: each layer is made in bf16 from its own seed (seed, then its index),
    initialised as the model initialises its weights, and quantized at once (convert_layer),
    so the bf16 model (212 GB) never exists; the embeddings, final norm and head stay bf16. About
    108 GB on an H200. Needs the engine's transformers (upstream's FP8 modules). `config`
    overrides the shapes (tests)."""
    import copy

    from transformers import Glm4MoeForCausalLM
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer

    config = config or synth.air_config(46)
    shell = copy.deepcopy(config)
    shell.num_hidden_layers = 0
    torch.manual_seed(seed)
    with torch.device(device):
        model = Glm4MoeForCausalLM._from_config(shell, dtype=torch.bfloat16)
    model.config.num_hidden_layers = config.num_hidden_layers
    default = torch.get_default_dtype()
    try:
        for i in range(config.num_hidden_layers):
            torch.manual_seed(seed * 100_003 + 1 + i)
            torch.set_default_dtype(torch.bfloat16)
            with torch.device(device):
                layer = Glm4MoeDecoderLayer(model.config, i)
            torch.set_default_dtype(default)
            for module in layer.modules():
                model._init_weights(module)
            convert_layer(layer, model.config, prefix=f"model.layers.{i}")
            model.model.layers.append(layer)
    finally:
        torch.set_default_dtype(default)
    return model.eval()

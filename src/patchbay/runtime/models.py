"""The checkpoint a config serves."""

from __future__ import annotations

from pathlib import Path

from .. import ROOT
from ..verb import Fail
from .config import Config


def tiny_path(seed: int, context: int) -> Path:
    """Where synthetic:tiny of this seed and context is kept: one folder each, so a server and the
    tests, at different contexts, never rewrite each other's checkpoint."""
    return ROOT / ".cache" / "models" / f"tiny-s{seed}-c{context}"


def trained_path(seed: int, context: int) -> Path:
    """Where synthetic:trained of this seed and context is kept."""
    return ROOT / ".cache" / "models" / f"trained-s{seed}-c{context}"


def trained_fp8_path(seed: int, context: int) -> Path:
    """Where synthetic:trained-fp8 (synthetic:trained in FP8, 128 x 128 blocks) is kept."""
    return ROOT / ".cache" / "models" / f"trained-fp8-s{seed}-c{context}"


def model_path(cfg: Config) -> str:
    """The checkpoint folder cfg serves: a synthetic model is written on first use (synthetic:trained
    is installed from the shipped checkpoint, or trained here for a seed that ships none;
    synthetic:trained-fp8 is that checkpoint quantized)."""
    if cfg.model == "synthetic:tiny":
        from . import synth

        return str(synth.write_tiny(tiny_path(cfg.synth_seed, cfg.synth_context), seed=cfg.synth_seed,
                                    context=cfg.synth_context))
    if cfg.model == "synthetic:trained":
        from . import trained

        return str(trained.write_trained(trained_path(cfg.synth_seed, cfg.synth_context), seed=cfg.synth_seed,
                                         context=cfg.synth_context))
    if cfg.model == "synthetic:trained-fp8":
        from . import fp8, trained

        src = trained.write_trained(trained_path(cfg.synth_seed, cfg.synth_context), seed=cfg.synth_seed,
                                    context=cfg.synth_context)
        return str(fp8.write_fp8(src, trained_fp8_path(cfg.synth_seed, cfg.synth_context), cfg.model))
    path = Path(cfg.model).resolve()
    if not (path / "config.json").is_file():
        raise Fail(f"{cfg.source}: MODEL={cfg.model}: no config.json in {path}; give a local checkpoint folder", 2)
    return str(path)

"""The checkpoint a config serves."""

from __future__ import annotations

from pathlib import Path

from .. import ROOT
from ..verb import Fail
from .config import Config


def model_path(cfg: Config) -> str:
    """The checkpoint folder cfg serves: the synthetic tiny model is written on first use."""
    if cfg.model == "synthetic:tiny":
        from . import synth

        return str(synth.write_tiny(ROOT / ".cache" / "models" / f"tiny-s{cfg.synth_seed}", seed=cfg.synth_seed))
    path = Path(cfg.model).resolve()
    if not (path / "config.json").is_file():
        raise Fail(f"{cfg.source}: MODEL={cfg.model}: no config.json in {path}; give a local checkpoint folder", 2)
    return str(path)

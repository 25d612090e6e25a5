"""patchbay: a pinned upstream engine, a knob-gated patch series, and the tools to serve it."""

from pathlib import Path

__version__ = "0.1.0"

# The repository root: src/patchbay/__init__.py -> ../../
ROOT = Path(__file__).resolve().parents[2]

"""Measurement tools, each run as `python -m patchbay.measure.tools.NAME` or as a hook inside the
engine (site/sitecustomize.py). Nothing is imported here: the engine-side hooks load this package
inside a server process, where only torch, transformers and the standard library can be counted on."""

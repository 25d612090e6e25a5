"""Batching and runtime: continuous batching's loop and graphs, sampling, tensor parallelism, host work."""

"""Pure @triton.jit kernels and the jit helpers they share; their launchers live beside their op.
Importing a module here imports Triton, so ops import them when they first launch."""

"""patchbay's additions to the engine. Every behaviour here sits behind a PB_* knob that is
off by default; with every knob unset the engine serves exactly what upstream serves.
Upstream files only carry thin hooks into these modules.

Layers, each importing only those below it: `api` (the request and response path of the
server) -> `runtime` (continuous batching, tensor parallelism, CUDA graphs, host work) ->
`ops` (the model's operations and their launchers) -> `ops.kernels` (pure @triton.jit
kernels). `knobs` (the knob runtime) serves all; `load` (the model-load sequence) calls into
runtime and ops."""

"""The runtime layer: the one config, the engine's process (environment, launch, load hooks), the
synthetic models, and serving behind one interface (`serving.runtime_for`: local processes or
Docker containers, `runtime.docker`). It may import the series layer.

Nothing is imported here: `python -m patchbay.runtime.procenv` runs in images that hold only the
standard library and patchbay's source."""

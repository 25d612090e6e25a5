"""The series layer: the pinned upstream, the numbered patches and their knobs, the engine build,
rebases and the dev tree. It imports nothing of patchbay's other layers."""

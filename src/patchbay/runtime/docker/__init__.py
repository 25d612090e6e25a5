"""RUNTIME=docker: the serving image, the nodes, preflight and its in-container probe, the
tensor-parallel pair, and the Docker runtime's verbs. Nothing is imported here: the probe runs
inside a container as `python3 -m patchbay.runtime.docker.probe`."""

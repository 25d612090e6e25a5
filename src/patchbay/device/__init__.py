"""The device layer: jobs for a GPU machine that has torch but no network (run through
scripts/gpu-run.sh as `python -m patchbay.device VERB`). It may import the measure, runtime and
series layers, never the CLI."""

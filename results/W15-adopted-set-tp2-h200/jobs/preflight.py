"""Device preflight for the v8 jobs (run under scripts/gpu-run.sh patched).

    python3 .jobs/v8/preflight.py NAME=JSON ...

Prints torch/triton/GPU and the installed engine's build id, then for each NAME=JSON set of PB_*
knobs the names this build does not declare. Exit 3 when any set names an unknown knob (a server
started with it refuses to start; gpu_profile stops at that setting), else 0.
"""

import json
import sys


def main(argv: list[str]) -> int:
    import torch
    import triton

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no CUDA device"
    print(f"preflight: python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, {gpu}")
    try:
        from transformers._pb import knobs
    except ImportError:
        print("preflight: FATAL: the engine on PYTHONPATH has no knob runtime (not the patched wheel?)")
        return 3
    info = knobs.build_info()
    registry = knobs.registry()
    print(f"preflight: build {info.get('build_id')}, {len(info.get('patches', []))} patches, {len(registry)} knobs")
    bad = 0
    for spec in argv:
        name, _, body = spec.partition("=")
        wanted = json.loads(body)
        missing = sorted(k for k in wanted if k not in registry)
        wrong = []
        for k, v in wanted.items():
            if k in registry:
                try:
                    knobs.parse(k, v)
                except knobs.KnobError as e:
                    wrong.append(str(e))
        if missing or wrong:
            bad += 1
            print(f"preflight: {name}: NOT in this build: {', '.join(missing) or '-'}"
                  + (f"; bad values: {'; '.join(wrong)}" if wrong else ""))
        else:
            print(f"preflight: {name}: all {len(wanted)} knobs known")
    return 3 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

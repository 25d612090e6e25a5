#!/usr/bin/env bash
# On a GPU machine with torch but no network: install the wheels gathered by
# `python -m patchbay.device wheels` (in .whl/), then run a GPU job.
#   scripts/gpu-run.sh ENGINE CMD...   ENGINE: upstream | patched
# The engine's transformers goes first on PYTHONPATH, then the carried packages, then patchbay.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
engine="${1:?usage: scripts/gpu-run.sh upstream|patched CMD...}"; shift
site=/tmp/pb-site
# A warm machine keeps /tmp between calls: install again when the carried wheels are not the ones
# installed (the patched engine's name carries its build id).
stamp="$(cd "$root/.whl" && ls *.whl | sort | tr '\n' ' ')"
if [ "$(cat "$site/.done" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$site" /tmp/pb-engine-patched /tmp/pb-engine-upstream
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" \
        $(ls "$root"/.whl/*.whl | grep -v '/transformers-')
    for wheel in "$root"/.whl/transformers-*.whl; do
        case "$(basename "$wheel")" in
            transformers-*+pb.*) dest=/tmp/pb-engine-patched ;;
            *) dest=/tmp/pb-engine-upstream ;;
        esac
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$dest" "$wheel"
    done
    mkdir -p "$site" && echo "$stamp" > "$site/.done"
fi
export PYTHONPATH="/tmp/pb-engine-$engine:$site:$root/src"
# The engine's process environment, NVLink multicast off for the ranks a job starts (patchbay.runtime.procenv).
exec python3 -m patchbay.runtime.procenv --ranks -- "$@"

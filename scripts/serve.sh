#!/usr/bin/env bash
# Thin wrapper: every verb (build, start, stop, status, logs, check, ...) is patchbay's.
#   scripts/serve.sh start            serve config/local.env (else the embedded default)
#   scripts/serve.sh --help           list the verbs
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/python" -m patchbay "$@"

#!/usr/bin/env bash
# The whole test suite (what CI runs). Extra arguments go to pytest, e.g. `-m "not engine"`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest -q -m "not gpu and not docker" "$@"

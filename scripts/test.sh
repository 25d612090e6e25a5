#!/usr/bin/env bash
# The whole test suite (what CI runs). Extra arguments go to pytest, e.g. `-m "not engine and not docker"`.
# The docker tier skips when no Docker engine answers (PATCHBAY_REQUIRE_DOCKER=1 makes that a failure).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest -q -m "not gpu" --durations=40 "$@"

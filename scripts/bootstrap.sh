#!/usr/bin/env bash
# Make sure .venv holds patchbay and every pinned dependency (pyproject.toml is the one
# place they are pinned). Reinstalls only when pyproject.toml changed. Quiet when all is well.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PATCHBAY_PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "patchbay: needs Python >= 3.11 (found: $("$python" --version 2>&1)); set PATCHBAY_PYTHON" >&2
    exit 2
fi
stamp="$venv/.patchbay-deps"
want="$(sha256sum "$root/pyproject.toml" | cut -c1-64)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "patchbay: creating $venv" >&2
    "$python" -m venv "$venv"
fi
echo "patchbay: installing pinned dependencies into $venv (a few minutes the first time)" >&2
log="$venv/.patchbay-install.log"
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root[engine,test,bench,docker]" >"$log" 2>&1; then
    # The host's pip configuration may name index folders that do not exist; pip warns about each.
    grep -v '^WARNING: Location .* is ignored' "$log" >&2 || true
    echo "patchbay: installing dependencies failed; the full log is $log" >&2
    exit 1
fi
echo "$want" > "$stamp"

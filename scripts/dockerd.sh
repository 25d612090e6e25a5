#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine: start dockerd (overlay2) in the background
# when none does, then wait until it is reachable. For CI and fresh machines; needs root.
set -euo pipefail
log="${DOCKERD_LOG:-/var/log/patchbay-dockerd.log}"
if docker info >/dev/null 2>&1; then
    exit 0
fi
if ! command -v dockerd >/dev/null; then
    echo "dockerd.sh: dockerd is not installed (apt-get install -y docker.io)" >&2
    exit 1
fi
echo "dockerd.sh: starting dockerd (storage driver overlay2, log $log)" >&2
nohup dockerd --storage-driver overlay2 >"$log" 2>&1 &
for _ in $(seq 1 60); do
    if docker info >/dev/null 2>&1; then
        exit 0
    fi
    sleep 1
done
echo "dockerd.sh: dockerd did not become reachable within 60s; last log lines:" >&2
tail -n 20 "$log" >&2
exit 1

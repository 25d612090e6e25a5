#!/usr/bin/env bash
# v9 call C (nvidia-h200-x2, warm): GPU kernel tests, then the same arms' cold 8K at TP=1 (one GPU each).
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_wheels || exit 2
timeout -k 10 200 "${GPU_RUN[@]}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py > "$OUT/kernel-tests-v9.txt" 2>&1
log "kernel tests rc=$?: $(tail -n 1 "$OUT/kernel-tests-v9.txt")"
export V8_EXTRA_KNOBS='{"PB_HOST_THREADS": "1"}'
V8_BUDGET=$(( BUDGET - (SECONDS - T0) )) V8_TP=1 V8_AIR12=auto V8_NAME=adopt-tp1-cold-8k-api bash "$V8/j2.sh"

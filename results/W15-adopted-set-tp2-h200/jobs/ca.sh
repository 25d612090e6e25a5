#!/usr/bin/env bash
# v9 call A (nvidia-h200-x2): the adoption candidate (PROD + 0400 + 0410 + 0420 + PB_HOST_THREADS=1)
# vs PROD, cold 8K first token through the API at TP=2 (writes /tmp/air12 for the calls after it).
export V8_EXTRA_KNOBS='{"PB_HOST_THREADS": "1"}'
V8_TP=2 V8_AIR12=auto V8_NAME=adopt-tp2-cold-8k-api bash "$(dirname "${BASH_SOURCE[0]}")/j2.sh"

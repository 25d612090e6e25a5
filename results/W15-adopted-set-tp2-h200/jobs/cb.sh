#!/usr/bin/env bash
# v9 call B (nvidia-h200-x2, warm after A): the same arms, decode C1/C8/C32 with --score at TP=2, 4 paired passes.
export V8_EXTRA_KNOBS='{"PB_HOST_THREADS": "1"}'
V8_TP=2 V8_REPS=4 V8_AIR12=auto V8_NAME=adopt-tp2-api bash "$(dirname "${BASH_SOURCE[0]}")/j3.sh"

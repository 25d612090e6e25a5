#!/usr/bin/env bash
# v9 call D (nvidia-h200-x2): what stalls a C8/C32 pass's first tokens. The same A/B as cb.sh
# (TP=2, count, C8 and C32, 4 reps, no score) with stallhook/sitecustomize.py in every process:
# Triton compiles, CUDA-graph captures and request arrivals on the monotonic clock.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_wheels || exit 2
export V8_EXTRA_KNOBS='{"PB_HOST_THREADS": "1"}'
NEW=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$NEW" "$V8_EXTRA_KNOBS")
ensure_air12 180 || exit 2
NAME=stall-tp2-api; D="$OUT/$NAME"; mkdir -p "$D"
export STALLPROF_DIR="$D/events"
cat > "$D/client.py" <<'PY'
import sys, time, runpy
import patchbay.bench as b
orig = b.run
def run(plan, sink, progress=None, switch=None):
    print(f"EPOCH {time.perf_counter():.6f}", flush=True)
    return orig(plan, sink, progress, switch)
b.run = run
sys.argv = ["patchbay.gpu"] + sys.argv[1:]
runpy.run_module("patchbay.gpu", run_name="__main__")
PY
cmd=(python3 "$D/client.py" ab --cuda-graphs --num-blocks 192 --port 8071 "${MODEL_ARGS[@]}"
     --a-tp 2 --b-tp 2 --logs "$D/logs" --a-env "$NEW" --b-env "$PROD"
     -- --suites count --max-tokens 512 --reps 4 --warmup 1 --results-dir "$D/res" --quiet --timeout 120
     --concurrency 8,32 --distinct-copies --window "$NAME" --time-limit 150)
t=$SECONDS
timeout -k 20 $(( $(left) - 30 )) "${GPU_RUN[@]}" bash -c 'PYTHONPATH=$0:$PYTHONPATH exec "$@"' "$V8/stallhook" "${cmd[@]}" 2>&1 | tee "$D/client.log" | grep -v "^\s*$" | tail -n 30
log "ab rc=${PIPESTATUS[0]} in $((SECONDS - t)) s"
ls "$D/events" | head; wc -l "$D"/events/* | tail -n 1
tar czf "$OUT/$NAME.tgz" -C "$OUT" "$NAME" && rm -rf "$D"

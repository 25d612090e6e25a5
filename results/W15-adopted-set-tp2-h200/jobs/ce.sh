#!/usr/bin/env bash
# v9 call E (nvidia-h200-x2): 0450. GPU kernel tests, then A = the W15 set + PB_STABLE_LAUNCH=1 vs
# B = the W15 set, TP=2, count C1/C8/C32 (4 reps, no score) with stallhook in every process.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
install_wheels || exit 2
timeout -k 10 150 "${GPU_RUN[@]}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py > "$OUT/kernel-tests-v10.txt" 2>&1
log "kernel tests rc=$?: $(tail -n 1 "$OUT/kernel-tests-v10.txt")"
W15=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update({"PB_HOST_THREADS": "1"}); print(json.dumps(d))' "$NEW")
A=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update({"PB_STABLE_LAUNCH": "1"}); print(json.dumps(d))' "$W15")
preflight "A=$A" "B=$W15" || exit 3
ensure_air12 180 || exit 2
NAME=stable-launch-tp2-api; D="$OUT/$NAME"; mkdir -p "$D"
export STALLPROF_DIR="$D/events"
cp "$V8/stallhook/sitecustomize.py" "$D/stall_hook.py"
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
     --a-tp 2 --b-tp 2 --logs "$D/logs" --a-env "$A" --b-env "$W15"
     -- --suites count --max-tokens 512 --reps 4 --warmup 1 --results-dir "$D/res" --quiet --timeout 120
     --concurrency 1,8,32 --distinct-copies --window "$NAME" --time-limit 150)
python3 -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "${cmd[@]}" > "$D/command.txt"
t=$SECONDS
timeout -k 20 $(( $(left) - 25 )) "${GPU_RUN[@]}" bash -c 'PYTHONPATH=$0:$PYTHONPATH exec "$@"' "$V8/stallhook" "${cmd[@]}" 2>&1 | tee "$D/client.log" | grep -v "^\s*$" | grep -v '^arm ' | tail -n 40
log "ab rc=${PIPESTATUS[0]} in $((SECONDS - t)) s"
grep -h "^patchbay: PB_STABLE" "$D"/logs/server-*/rank0.log | head -2
tar czf "$OUT/$NAME.tgz" -C "$OUT" "$NAME" && rm -rf "$D"

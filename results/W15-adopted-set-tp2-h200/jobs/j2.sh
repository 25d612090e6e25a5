#!/usr/bin/env bash
# v8 job 2 (one GPU): a cold 8K prompt's first token through the API at TP=1, A = NEW, B = PROD,
# 6 pairs after 2 warm-ups: W13's invariant-set-v6-tp1-cold-8k-api with the new knobs in arm A.
# Run from the repository root: bash .jobs/v8/j2.sh   (.whl and .jobs carried; see README.txt)
# Writes: $OUT/j2.log, $OUT/new-set-tp1-cold-8k-api.tgz (the window W01-new-set-tp1-cold-8k-api/,
# the servers' logs, command.txt), and flat in $OUT/new-set-tp1-cold-8k-api/: SUMMARY.md,
# summary.json, command.txt.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
NAME=${V8_NAME:-new-set-tp1-cold-8k-api}
D="$OUT/$NAME"

finish() {
    local w
    w=$(ls -d "$D"/res/W*-"$NAME" 2>/dev/null | head -n 1)
    pack_part "$NAME" "$w/SUMMARY.md" "$w/summary.json" "$D/command.txt"
}

main() {
    log "j2: $NAME (budget ${BUDGET} s)"
    mkdir -p "$D"
    install_wheels || return 2
    preflight "A=$NEW" "B=$PROD" || { log "FATAL: a knob of an arm is not in this build: the server would refuse to start"; return 3; }
    ensure_air12 180 || return 2
    local limit=$(( $(left) - 20 ))
    local cmd=(python3 -m patchbay.gpu ab --cuda-graphs --num-blocks 192 --port 8071 "${MODEL_ARGS[@]}"
               --a-tp "${V8_TP:-1}" --b-tp "${V8_TP:-1}" --logs "$D/logs" --a-env "$NEW" --b-env "$PROD"
               -- --suites prefill --cold --max-prompt-tokens 8192 --reps 6 --warmup 2 --concurrency 1
               --results-dir "$D/res" --quiet --timeout 120 --window "$NAME" --time-limit 100)
    python3 -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "${GPU_RUN[@]}" "${cmd[@]}" > "$D/command.txt"
    echo "air12: $AIR12_MODE" >> "$D/command.txt"
    log "gpu.py ab, air12 $AIR12_MODE, limit ${limit} s"
    local t=$SECONDS
    timeout -k 20 "$limit" "${GPU_RUN[@]}" "${cmd[@]}"
    local rc=$?
    log "gpu.py ab rc=$rc in $((SECONDS - t)) s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
    local w
    w=$(ls -d "$D"/res/W*-"$NAME" 2>/dev/null | head -n 1)
    [ -n "$w" ] && [ -f "$w/SUMMARY.md" ] && sed -n '1,60p' "$w/SUMMARY.md"
    for f in "$D"/logs/server-*/rank0.log "$D"/logs/server-*.log; do
        [ -f "$f" ] && { echo "--- $f (patchbay lines)"; grep -a '^patchbay' "$f" | cut -c1-300 | head -n 30; }
    done
    return $rc
}

( trap finish EXIT; main ) 2>&1 | tee "$OUT/j2.log"
exit "${PIPESTATUS[0]}"

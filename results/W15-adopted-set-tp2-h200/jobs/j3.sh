#!/usr/bin/env bash
# v8 job 3 (one GPU): decode through the API at TP=1 with --score, A = NEW, B = PROD: count prompts
# at C1/C8/C32 with --distinct-copies, 512-token replies, 3 paired passes after 1 warm-up; then the
# exactness prompts' greedy replies B vs A and the teacher-forced |Δ logprob| tables (B vs A, and
# A batched vs A alone). W13's invariant-set-v6-tp1-api with the new knobs in arm A.
# Run from the repository root: bash .jobs/v8/j3.sh   (.whl and .jobs carried; see README.txt)
# Writes: $OUT/j3.log, $OUT/new-set-tp1-api.tgz (window W01-new-set-tp1-api/, score/, the servers'
# logs, command.txt), and flat in $OUT/new-set-tp1-api/: SUMMARY.md, summary.json, command.txt,
# a-together-vs-a-alone.json, b-vs-a.json.
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
NAME=${V8_NAME:-new-set-tp1-api}
D="$OUT/$NAME"

finish() {
    local w
    w=$(ls -d "$D"/res/W*-"$NAME" 2>/dev/null | head -n 1)
    pack_part "$NAME" "$w/SUMMARY.md" "$w/summary.json" "$D/command.txt" \
        "$D/score/a-together-vs-a-alone.json" "$D/score/b-vs-a.json"
}

main() {
    log "j3: $NAME (budget ${BUDGET} s)"
    mkdir -p "$D"
    install_wheels || return 2
    preflight "A=$NEW" "B=$PROD" || { log "FATAL: a knob of an arm is not in this build: the server would refuse to start"; return 3; }
    ensure_air12 180 || return 2
    # ab's --time-limit (no new pass after it; W13 used 170 and its 24 passes took 83 s) leaves
    # RESERVE s for the two servers' starts, the score step and the stop: the job ends by BUDGET.
    local reserve=${V8_RESERVE:-240} tl
    tl=$(( $(left) - reserve ))
    [ $tl -gt 170 ] && tl=170
    [ $tl -lt 60 ] && tl=60
    local limit=$(( $(left) - 15 ))
    local cmd=(python3 -m patchbay.gpu ab --cuda-graphs --num-blocks 192 --port 8071 "${MODEL_ARGS[@]}"
               --a-tp "${V8_TP:-1}" --b-tp "${V8_TP:-1}" --logs "$D/logs" --score "$D/score" --a-env "$NEW" --b-env "$PROD"
               -- --suites count --max-tokens 512 --reps "${V8_REPS:-4}" --warmup 1 --results-dir "$D/res" --quiet --timeout 120
               --concurrency 1,8,32 --distinct-copies --window "$NAME" --time-limit "$tl")
    python3 -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "${GPU_RUN[@]}" "${cmd[@]}" > "$D/command.txt"
    echo "air12: $AIR12_MODE" >> "$D/command.txt"
    log "gpu.py ab --score, air12 $AIR12_MODE, ab --time-limit ${tl} s, limit ${limit} s"
    local t=$SECONDS
    timeout -k 20 "$limit" "${GPU_RUN[@]}" "${cmd[@]}"
    local rc=$?
    log "gpu.py ab rc=$rc in $((SECONDS - t)) s$([ $rc = 124 ] && echo ' (TIMED OUT)')"
    local w
    w=$(ls -d "$D"/res/W*-"$NAME" 2>/dev/null | head -n 1)
    [ -n "$w" ] && [ -f "$w/SUMMARY.md" ] && sed -n '1,80p' "$w/SUMMARY.md"
    ls -la "$D/score" 2>/dev/null
    for f in "$D"/logs/server-*/rank0.log "$D"/logs/server-*.log; do
        [ -f "$f" ] && { echo "--- $f (patchbay lines)"; grep -a '^patchbay' "$f" | cut -c1-300 | head -n 30; }
    done
    return $rc
}

( trap finish EXIT; main ) 2>&1 | tee "$OUT/j3.log"
exit "${PIPESTATUS[0]}"

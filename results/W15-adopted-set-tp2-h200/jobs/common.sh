# Sourced by .jobs/v8/j1.sh, j2.sh, j3.sh (device jobs; see README.txt). Not run on its own.
# Everything runs from the repository root, under scripts/gpu-run.sh patched (the carried .whl
# installed into /tmp/pb-site and /tmp/pb-engine-*; the engine first on PYTHONPATH, then src/).
set -uo pipefail
V8="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$V8/../.." && pwd)"
cd "$ROOT" || exit 2
: "${OUT:?OUT is not set: run through the run tool, or export OUT=/some/empty/dir}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# Keep NVLink multicast off, as the device's README asks (gpu-run.sh sets these too).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

T0=$SECONDS
BUDGET=${V8_BUDGET:-540}   # seconds this job may take in all (the run tool's limit is 600)
left() { echo $(( BUDGET - (SECONDS - T0) )); }
log() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - T0))s] $*"; }
# V8_GPU_RUN replaces the wrapper (a local dry run of these scripts' plumbing); default gpu-run.sh.
read -ra GPU_RUN <<< "${V8_GPU_RUN:-bash scripts/gpu-run.sh patched}"

# PROD: the A-env of results/W13-invariant-set-adopted-h200/invariant-set-v6-tp1-api/command.txt
# (= config/prod.env.example's PB_* lines without PB_TENSOR_PARALLEL, plus PB_FORCED_DECODING=1).
PROD='{"PB_SSE_DONE": "1", "PB_CONTEXT_LIMIT": "1", "PB_MODELS_INFO": "1", "PB_TOKENIZE": "1", "PB_FINGERPRINT": "1", "PB_GLM_MESSAGES": "1", "PB_GLM_PARSER": "1", "PB_REQUEST_SAMPLING": "1", "PB_REASONING_FIELD": "reasoning_content", "PB_STRUCTURED_OUTPUT": "1", "PB_TOOL_CHOICE": "1", "PB_GRAPH_BUCKETS": "1", "PB_ASYNC_BATCHING": "1", "PB_GRAPH_SAMPLING": "1", "PB_FUSED_MOE": "1", "PB_FUSED_ROUTER": "1", "PB_FUSED_ROPE": "1", "PB_FUSED_NORM": "1", "PB_FUSED_PROJ": "1", "PB_CAUSAL_PREFILL": "1", "PB_MOE_COMBINE": "1", "PB_MOE_GATE": "1", "PB_STEP_PREP": "1", "PB_FAST_ENCODE": "1", "PB_VARLEN_ATTENTION": "1", "PB_FORCED_DECODING": "1", "PB_INVARIANT_GEMM": "1", "PB_MOE_ONE_PATH": "1"}'
# NEW: PROD + PB_VARLEN_FAST (0400) + PB_GEMM_TMA (0410) + PB_SPLIT_ENCODE.
NEW='{"PB_SSE_DONE": "1", "PB_CONTEXT_LIMIT": "1", "PB_MODELS_INFO": "1", "PB_TOKENIZE": "1", "PB_FINGERPRINT": "1", "PB_GLM_MESSAGES": "1", "PB_GLM_PARSER": "1", "PB_REQUEST_SAMPLING": "1", "PB_REASONING_FIELD": "reasoning_content", "PB_STRUCTURED_OUTPUT": "1", "PB_TOOL_CHOICE": "1", "PB_GRAPH_BUCKETS": "1", "PB_ASYNC_BATCHING": "1", "PB_GRAPH_SAMPLING": "1", "PB_FUSED_MOE": "1", "PB_FUSED_ROUTER": "1", "PB_FUSED_ROPE": "1", "PB_FUSED_NORM": "1", "PB_FUSED_PROJ": "1", "PB_CAUSAL_PREFILL": "1", "PB_MOE_COMBINE": "1", "PB_MOE_GATE": "1", "PB_STEP_PREP": "1", "PB_FAST_ENCODE": "1", "PB_VARLEN_ATTENTION": "1", "PB_FORCED_DECODING": "1", "PB_INVARIANT_GEMM": "1", "PB_MOE_ONE_PATH": "1", "PB_VARLEN_FAST": "1", "PB_GEMM_TMA": "1", "PB_SPLIT_ENCODE": "1"}'
# V8_B_EXTRA_KNOBS (a JSON object) adds knobs to PROD (arm B)
if [ -n "${V8_B_EXTRA_KNOBS:-}" ]; then
    PROD=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$PROD" "$V8_B_EXTRA_KNOBS")
fi
# V8_EXTRA_KNOBS (a JSON object) adds knobs to NEW
if [ -n "${V8_EXTRA_KNOBS:-}" ]; then
    NEW=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); d.update(json.loads(sys.argv[2])); print(json.dumps(d))' "$NEW" "$V8_EXTRA_KNOBS")
fi

# The carried wheels: installed once per machine by gpu-run.sh (/tmp/pb-site/.done marks it).
install_wheels() {
    local n
    n=$(ls .whl/transformers-*+pb.*.whl 2>/dev/null | wc -l)
    if [ "$n" != 1 ]; then
        log "FATAL: .whl must hold exactly one patched engine wheel (transformers-*+pb.*.whl), found $n:" \
            "run 'python -m patchbay.gpu wheels' here and carry .whl"
        ls -la .whl 2>&1 | sed 's/^/  /'
        return 2
    fi
    log "engine wheel: $(basename .whl/transformers-*+pb.*.whl)"
    local t=$SECONDS
    if ! timeout -k 10 240 "${GPU_RUN[@]}" true; then
        log "FATAL: installing the carried wheels failed"
        return 2
    fi
    log "wheels installed in $((SECONDS - t)) s"
}

# Machine, build and whether every knob of each NAME=JSON set exists in the installed build.
# Prints one line per set; exit 3 when a set names a knob the build lacks (the server would refuse
# to start: knobs.load refuses unknown PB_* names).
preflight() {
    log "machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | paste -sd';')," \
        "$(nproc) cores, /tmp free $(df -Ph /tmp | awk 'NR==2{print $4}')"
    timeout -k 10 120 "${GPU_RUN[@]}" python3 "$V8/preflight.py" "$@"
}

# air12 for the API jobs: ensure_air12 LIMIT [RESERVE] (the write's timeout; the seconds that
# must be left after it, else auto serves air12 in memory). Sets MODEL_ARGS: (--model-dir DIR) for the checkpoint W13 served
# (written by `patchbay synth air12 DIR` if missing: 54 GB, 72 s in W07 on the x2 machine), or ()
# for air12 built in memory by each server (gpu.py ab's default). V8_AIR12=dir|mem|auto (default
# auto: the checkpoint when it exists or its disk has room, else memory). V8_MODEL_DIR (default
# /tmp/air12). The one-GPU kind has 64 GiB of disk: the checkpoint may not fit there.
MODEL_ARGS=()
AIR12_MODE=""
ensure_air12() {
    local dir=${V8_MODEL_DIR:-/tmp/air12} mode=${V8_AIR12:-auto} limit=${1:-240} reserve=${2:-120} free t
    if [ "$mode" = mem ]; then
        MODEL_ARGS=(); AIR12_MODE="in memory (V8_AIR12=mem)"; log "air12: $AIR12_MODE"; return 0
    fi
    if [ -f "$dir/patchbay-synth.json" ]; then
        MODEL_ARGS=(--model-dir "$dir"); AIR12_MODE="checkpoint $dir (already there)"; log "air12: $AIR12_MODE"
        return 0
    fi
    mkdir -p "$(dirname "$dir")"
    free=$(( $(df -Pk "$(dirname "$dir")" | awk 'NR==2{print $4}') / 1048576 ))
    if [ "$mode" = auto ] && [ "$free" -lt 53 ]; then
        MODEL_ARGS=(); AIR12_MODE="in memory (only $free GiB free under $(dirname "$dir"); the checkpoint needs ~51)"
        log "air12: $AIR12_MODE"; return 0
    fi
    if [ "$(left)" -lt $(( limit + reserve )) ] && [ "$mode" = auto ]; then
        MODEL_ARGS=(); AIR12_MODE="in memory (too little time left to write the checkpoint)"
        log "air12: $AIR12_MODE"; return 0
    fi
    log "air12: writing the checkpoint to $dir ($free GiB free)"
    t=$SECONDS
    if timeout -k 10 "$limit" "${GPU_RUN[@]}" python3 -m patchbay synth air12 "$dir" \
            && [ -f "$dir/patchbay-synth.json" ]; then
        MODEL_ARGS=(--model-dir "$dir"); AIR12_MODE="checkpoint $dir (written in $((SECONDS - t)) s)"
        log "air12: $AIR12_MODE"; return 0
    fi
    log "air12: writing the checkpoint failed after $((SECONDS - t)) s"
    if [ "$mode" = dir ]; then return 2; fi
    rm -rf "$dir" "$(dirname "$dir")"/."$(basename "$dir")".*
    MODEL_ARGS=(); AIR12_MODE="in memory (writing the checkpoint failed)"; log "air12: $AIR12_MODE"
}

# A part's folder under $OUT: a results window and logs are too deep for the device's return
# ($OUT/a/b/file comes back, $OUT/a/b/c/file does not; 8 files at most), so pack_part tars the
# whole folder into $OUT/NAME.tgz and then keeps only the named files flat in $OUT/NAME/.
pack_part() {
    local name=$1; shift
    local dir="$OUT/$name" keep f
    [ -d "$dir" ] || return 0
    tar czf "$OUT/$name.tgz" -C "$dir" . && log "packed $OUT/$name.tgz ($(du -h "$OUT/$name.tgz" | cut -f1))"
    keep=$(mktemp -d)
    for f in "$@"; do
        [ -f "$f" ] && cp "$f" "$keep/"
    done
    rm -rf "$dir"; mkdir -p "$dir"
    cp "$keep"/* "$dir/" 2>/dev/null
    rm -rf "$keep"
    log "left in $OUT: $(cd "$OUT" && find . -type f | sort | paste -sd' ')"
}

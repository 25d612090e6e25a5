#!/usr/bin/env bash
# 0870 on air12: what drafting costs where drafts are rejected, with backoff; one server, arms per request
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
mkdir -p $OUT/res
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
eval "$(PYTHONPATH=src python3 -c 'from patchbay.runtime.config import knob_set
for k, v in knob_set("prod").items(): print(f"export {k}={v!r}")')"
export PB_TENSOR_PARALLEL=0 PB_HOST_TIER_MB=0 PB_DRAFT_STREAMS=2 PB_DRAFT_ASYNC=1 PB_DRAFT_BACKOFF=16
env | grep '^PB_' | sort > $OUT/env.txt
left=$(( 570 - $(el) ))
timeout $left scripts/gpu-run.sh patched python3 -m patchbay.device ab --cuda-graphs --num-blocks 256 --logs /tmp/logs-air12 -- \
  --workload agent --modes greedy,sampled --knob PB_DRAFT_TOKENS=0,8 --concurrency 1,2,64 --reps 2 --warmup 1 --requests 4 \
  --prompt-tokens 600 --max-tokens 128 --time-limit $(( left - 100 )) --window draft-backoff-air12 --results-dir $OUT/res > $OUT/ab-air12.txt 2>&1
echo "ab air12 rc=$? at $(el) s" >> $OUT/ab-air12.txt
cd $OUT && tar czf res.tgz res 2>/dev/null; tar czf logs.tgz /tmp/logs-air12 2>/dev/null; true

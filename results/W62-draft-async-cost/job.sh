#!/usr/bin/env bash
# 0860 for adoption: trained side by side (modes, C64), air12 per request (prose cost), then the GPU test
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
mkdir -p $OUT/res
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
scripts/gpu-run.sh patched python3 -m patchbay synth trained /tmp/trained --dtype bfloat16 > $OUT/synth.txt 2>&1
A='@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0}'
B='@prod+{"PB_TENSOR_PARALLEL":0,"PB_HOST_TIER_MB":0,"PB_DRAFT_TOKENS":8,"PB_DRAFT_STREAMS":2,"PB_DRAFT_ASYNC":1}'
timeout 230 scripts/gpu-run.sh patched python3 -m patchbay.device ab --model-dir /tmp/trained --cuda-graphs --num-blocks 512 \
  --a-env "$A" --b-env "$B" --logs /tmp/logs-trained -- --workload agent --modes greedy,sampled,json,tools-required,conversation \
  --concurrency 1,64 --reps 2 --warmup 1 --prompt-tokens 600 --max-tokens 128 --time-limit 150 \
  --window draft-async-modes --results-dir $OUT/res > $OUT/ab-trained.txt 2>&1
echo "ab trained rc=$? at $(el) s" >> $OUT/ab-trained.txt
(
eval "$(PYTHONPATH=src python3 -c 'from patchbay.runtime.config import knob_set
for k, v in knob_set("prod").items(): print(f"export {k}={v!r}")')"
export PB_TENSOR_PARALLEL=0 PB_HOST_TIER_MB=0 PB_DRAFT_STREAMS=2 PB_DRAFT_ASYNC=1
left=$(( 560 - $(el) ))
timeout $left scripts/gpu-run.sh patched python3 -m patchbay.device ab --cuda-graphs --num-blocks 256 -- \
  --workload agent --modes greedy,sampled --knob PB_DRAFT_TOKENS=0,8 --concurrency 1,2,64 --reps 2 --warmup 1 \
  --prompt-tokens 600 --max-tokens 128 --time-limit $(( left - 110 )) --window draft-async-air12 --results-dir $OUT/res > $OUT/ab-air12.txt 2>&1
echo "ab air12 rc=$? at $(el) s" >> $OUT/ab-air12.txt
)
left=$(( 580 - $(el) ))
if [ $left -gt 60 ]; then
  timeout $left scripts/gpu-run.sh patched python3 -m pytest -m gpu tests/test_drafts_gpu.py -q -p no:cacheprovider -x > $OUT/gpu-test.txt 2>&1
  echo "gpu test rc=$? at $(el) s" >> $OUT/gpu-test.txt
fi
cd $OUT && tar czf res.tgz res 2>/dev/null; true

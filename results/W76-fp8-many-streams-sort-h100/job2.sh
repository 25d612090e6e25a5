#!/usr/bin/env bash
# Call 2: one decode step's kernels, air12-fp8 against air12 bf16, the production set on one GPU,
# distinct 600-token prompts at C1, C64 and C128 (one process a model).
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
mkdir -p $OUT/r
save() { tar czf $OUT/x.tgz -C $OUT/r . ; }
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/r/gpu.txt
KN=$(python3 -c 'import sys; sys.path.insert(0,"src"); import json; from patchbay.device.gpu import parse_env; print(json.dumps(parse_env("@prod+{\"PB_TENSOR_PARALLEL\":0,\"PB_HOST_TIER_MB\":0}", "env")))')
PROD='{"use_cuda_graph": true, "knobs": '$KN'}'
FP8=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['knobs']['PB_FP8_WEIGHTS']='1'; print(json.dumps(d))" "$PROD")
common="--distinct-prompts --levels 1,64,128 --profile-levels 1,64,128 --tokens 128 --profile-tokens 16 --prompt-tokens 600"
timeout 240 scripts/gpu-run.sh patched python3 -m patchbay.device profile --out $OUT/r/fp8 --synthetic synthetic:air12-fp8 \
  --setting "prod-fp8=$FP8" $common > $OUT/r/fp8.txt 2>&1
echo "fp8 rc=$? at $(el) s" >> $OUT/r/fp8.txt; save
left=$(( 480 - $(el) ))
timeout $left scripts/gpu-run.sh patched python3 -m patchbay.device profile --out $OUT/r/bf16 --synthetic synthetic:air12 \
  --setting "production=$PROD" $common > $OUT/r/bf16.txt 2>&1
echo "bf16 rc=$? at $(el) s" >> $OUT/r/bf16.txt; save

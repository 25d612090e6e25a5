#!/usr/bin/env bash
# Call 1: where a C64 / C128 decode step goes with distinct requests (in-process profile, then a served profile).
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
PROD='{"use_cuda_graph": true, "knobs": '$(python3 -c 'import sys; sys.path.insert(0,"src"); import json; from patchbay.device.gpu import parse_env; print(json.dumps(parse_env("@prod+{\"PB_TENSOR_PARALLEL\":0,\"PB_HOST_TIER_MB\":0}", "env")))')'}'
ROWS=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['knobs']['PB_MOE_DECODE_ROWS']='16'; print(json.dumps(d))" "$PROD")
echo "$PROD" > $OUT/settings.txt; echo "$ROWS" >> $OUT/settings.txt
timeout 230 scripts/gpu-run.sh patched python3 -m patchbay.device profile --out $OUT/profile --distinct-prompts \
  --setting "production=$PROD" --setting "decode-rows-16=$ROWS" --levels 64,128 --profile-levels 64,128 \
  --tokens 128 --profile-tokens 16 --prompt-tokens 600 > $OUT/profile.txt 2>&1
echo "profile rc=$? at $(el) s" >> $OUT/profile.txt
cd $OUT && tar czf profile.tgz profile; cd - >/dev/null
ENV=$(python3 -c 'import sys; sys.path.insert(0,"src"); import json; from patchbay.device.gpu import parse_env; print(json.dumps(parse_env("@prod+{\"PB_TENSOR_PARALLEL\":0,\"PB_HOST_TIER_MB\":0}", "env")))')
for arm in production rows16; do
  left=$(( 560 - $(el) ))
  [ $left -lt 90 ] && { echo "served $arm skipped at $(el) s" >> $OUT/served.txt; continue; }
  E="$ENV"; [ $arm = rows16 ] && E=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['PB_MOE_DECODE_ROWS']='16'; print(json.dumps(d))" "$ENV")
  timeout $left scripts/gpu-run.sh patched python3 -m patchbay.device served-profile --out $OUT/served-$arm --cuda-graphs \
    --env "$E" --num-blocks 1024 --levels 64,128 --tokens 1024 --window-s 2 --distinct-prompts >> $OUT/served.txt 2>&1
  echo "served $arm rc=$? at $(el) s" >> $OUT/served.txt
  cd $OUT && rm -f served-$arm/rank0/started-*; gzip -f served-$arm/server*.log 2>/dev/null; tar czf served-$arm.tgz served-$arm; rm -rf served-$arm; cd - >/dev/null
done
rm -rf $OUT/profile; true

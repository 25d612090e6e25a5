#!/usr/bin/env bash
# Call: the decode-step profile with the experts the knobs choose (pb_triton) and 0930's wide decode
# graphs in process, then 0930 served (servers in turn) at C64 / C128.
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
KN=$(python3 -c 'import sys; sys.path.insert(0,"src"); import json; from patchbay.device.gpu import parse_env; print(json.dumps(parse_env("@prod+{\"PB_TENSOR_PARALLEL\":0,\"PB_HOST_TIER_MB\":0}", "env")))')
PROD='{"use_cuda_graph": true, "knobs": '$KN'}'
WIDE=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['knobs']['PB_DECODE_GRAPHS']='1'; print(json.dumps(d))" "$PROD")
ROWS=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['knobs']['PB_MOE_DECODE_ROWS']='16'; print(json.dumps(d))" "$PROD")
GROUPED=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['experts']='grouped_mm'; print(json.dumps(d))" "$PROD")
timeout 240 scripts/gpu-run.sh patched python3 -m patchbay.device profile --out $OUT/profile --distinct-prompts \
  --setting "production=$PROD" --setting "decode-graphs=$WIDE" --setting "decode-rows-16=$ROWS" --setting "grouped-mm=$GROUPED" \
  --levels 64,128 --profile-levels 64,128 --tokens 128 --profile-tokens 16 --prompt-tokens 600 > $OUT/profile.txt 2>&1
echo "profile rc=$? at $(el) s" >> $OUT/profile.txt
cd $OUT && tar czf profile.tgz profile && rm -rf profile; cd - >/dev/null
left=$(( 565 - $(el) ))
timeout $left scripts/gpu-run.sh patched python3 devjob/dg.py $OUT/dg $(( left - 15 )) > $OUT/dg.txt 2>&1
echo "dg rc=$? at $(el) s" >> $OUT/dg.txt
cd $OUT && gzip -f dg/*/server*.log 2>/dev/null; tar czf dg.tgz dg && rm -rf dg; true

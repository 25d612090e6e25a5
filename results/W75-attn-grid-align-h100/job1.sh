#!/usr/bin/env bash
# Call 1: 0940's bits on the GPU (kernel tests), its in-process decode-step profile against
# production at C8/C64/C128 with distinct prompts, and the experts' decode tiles at 64 and 128 tokens.
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
timeout 150 scripts/gpu-run.sh patched python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py \
  -k "attn_grid or varlen_attention_stays or cache_read_gives or stable_launch_sorts or moe_one_path_gives" > $OUT/gputests.txt 2>&1
echo "tests rc=$? at $(el) s" >> $OUT/gputests.txt
KN=$(python3 -c 'import sys; sys.path.insert(0,"src"); import json; from patchbay.device.gpu import parse_env; print(json.dumps(parse_env("@prod+{\"PB_TENSOR_PARALLEL\":0,\"PB_HOST_TIER_MB\":0}", "env")))')
PROD='{"use_cuda_graph": true, "knobs": '$KN'}'
GRID=$(python3 -c "import json,sys; d=json.loads(sys.argv[1]); d['knobs']['PB_ATTN_GRID']='1'; print(json.dumps(d))" "$PROD")
timeout 260 scripts/gpu-run.sh patched python3 -m patchbay.device profile --out $OUT/profile --distinct-prompts \
  --setting "production=$PROD" --setting "attn-grid=$GRID" \
  --levels 8,64,128 --profile-levels 8,64,128 --tokens 128 --profile-tokens 16 --prompt-tokens 600 > $OUT/profile.txt 2>&1
echo "profile rc=$? at $(el) s" >> $OUT/profile.txt
left=$(( 570 - $(el) )); [ $left -gt 150 ] && left=150
timeout $left scripts/gpu-run.sh patched python3 -m patchbay.device moe --out $OUT/moe --graphs --tokens 64,128 \
  --impls grouped_mm --tiles "32x128w4s4/32x128w4s4,64x128w4s4/32x128w4s4,32x256w4s3/32x128w4s4,32x128w4s4/64x128w4s4,32x128w4s4/64x64w4s4,64x64w4s4/64x64w4s4,32x128w8s4/32x128w8s4,16x256w4s4/32x128w4s4,32x64w4s4/32x64w4s4+tma,32x128w4s4/32x128w4s4+tma,64x64w4s4/64x64w4s4+tma,128x64w8s3/128x64w8s3" > $OUT/moe.txt 2>&1
echo "moe rc=$? at $(el) s" >> $OUT/moe.txt
left=$(( 585 - $(el) ))
for rows in 64 128; do
  [ $left -gt 40 ] || break
  timeout $(( left / 2 + 10 )) scripts/gpu-run.sh patched python3 -m patchbay.device sweep gemm $OUT/gemm$rows --rows $rows --tp 1 \
    --tiles "64x128x64w4s4,64x64x64w4s4,32x128x64w4s4,64x128x128w4s3,64x256x64w8s3,128x128x64w8s3,64x128x64w4s3,32x64x128w4s4,16x128x128w4s4" > $OUT/gemm$rows.txt 2>&1
  echo "gemm$rows rc=$? at $(el) s" >> $OUT/gemm$rows.txt
  left=$(( 585 - $(el) ))
done

#!/usr/bin/env bash
# Call 1: 0940's sized merge and the bf16_paged helper on the GPU (kernel tests); 0810's float8
# GEMM launch swept at 1 and 8 rows (tile, programs, depth; graph replays past L2); each FP8
# product and the routed experts against their bf16 twin at 1-128 tokens.
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
mkdir -p $OUT/r
save() { tar czf $OUT/x.tgz -C $OUT/r . ; }
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/r/gpu.txt
timeout 130 scripts/gpu-run.sh patched python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py \
  -k "attn_grid or cache_read_gives or sorts_of_many_pairs" > $OUT/r/gputests.txt 2>&1
echo "tests rc=$? at $(el) s" >> $OUT/r/gputests.txt; save
timeout 170 scripts/gpu-run.sh patched python3 -m patchbay.device sweep fp8 $OUT/r/sweep1 --rows 1 --experts > $OUT/r/sweep1.txt 2>&1
echo "sweep1 rc=$? at $(el) s" >> $OUT/r/sweep1.txt; save
timeout 130 scripts/gpu-run.sh patched python3 -m patchbay.device fp8 --out $OUT/r/fp8 --tokens 1,8,64,128 > $OUT/r/fp8.txt 2>&1
echo "fp8 rc=$? at $(el) s" >> $OUT/r/fp8.txt; save
timeout 90 scripts/gpu-run.sh patched python3 -m patchbay.device moe --out $OUT/r/moe --graphs --tokens 64,128 --impls "" > $OUT/r/moe.txt 2>&1
echo "moe rc=$? at $(el) s" >> $OUT/r/moe.txt; save
left=$(( 470 - $(el) ))
if [ $left -gt 40 ]; then
  timeout $left scripts/gpu-run.sh patched python3 -m patchbay.device sweep fp8 $OUT/r/sweep8 --rows 8 \
    --tiles 64w4s4,32w4s4,128w4s4,64w4s6 --programs 264,132,528 --depths 128 --experts > $OUT/r/sweep8.txt 2>&1
  echo "sweep8 rc=$? at $(el) s" >> $OUT/r/sweep8.txt
fi
save

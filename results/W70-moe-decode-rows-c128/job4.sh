#!/usr/bin/env bash
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
timeout 200 scripts/gpu-run.sh patched python3 devjob/profile.py $OUT/profile > $OUT/profile.txt 2>&1
echo "profile rc=$? at $(el) s" >> $OUT/profile.txt
timeout 90 scripts/gpu-run.sh patched python3 -m pytest -m gpu tests/test_kernels_gpu.py -q -p no:cacheprovider -rA -k "0910 or one_path" > $OUT/gpu-test.txt 2>&1
echo "gpu test rc=$? at $(el) s" >> $OUT/gpu-test.txt
left=$(( 540 - $(el) ))
timeout $left scripts/gpu-run.sh patched python3 devjob/rows_ab.py $OUT $(( left - 10 )) > $OUT/run.txt 2>&1
echo "rows rc=$? at $(el) s" >> $OUT/run.txt
cd $OUT && gzip -f server-*.log; tar czf res.tgz [0-9]-* profile 2>/dev/null; true

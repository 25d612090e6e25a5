#!/usr/bin/env bash
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
mkdir -p $OUT/res
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
scripts/gpu-run.sh patched python3 -m patchbay synth trained /tmp/trained --dtype bfloat16 > $OUT/synth.txt 2>&1
timeout 310 scripts/gpu-run.sh patched python3 devjob/trained.py $OUT 290 > $OUT/trained.txt 2>&1
echo "trained rc=$? at $(el) s" >> $OUT/trained.txt
left=$(( 585 - $(el) ))
if [ $left -gt 100 ]; then
  timeout $left scripts/gpu-run.sh patched python3 -m pytest -m gpu tests/test_drafts_gpu.py -q -p no:cacheprovider -x -rA --durations=5 > $OUT/gpu-test.txt 2>&1
  echo "gpu test rc=$? at $(el) s" >> $OUT/gpu-test.txt
fi
cd $OUT && tar czf res.tgz res logs 2>/dev/null; true

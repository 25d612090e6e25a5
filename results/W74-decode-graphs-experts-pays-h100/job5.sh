#!/usr/bin/env bash
# Call: 0900 PB_DRAFT_PAYS 0 against 2 on air12 and synthetic:trained (servers in turn).
set -x
start=$(date +%s)
el() { echo $(( $(date +%s) - start )); }
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
timeout 60 scripts/gpu-run.sh patched python3 -m patchbay synth trained /tmp/trained --dtype bfloat16 > $OUT/synth.txt 2>&1; echo "synth rc=$? at $(el) s" >> $OUT/synth.txt
left=$(( 480 - $(el) ))
timeout $left scripts/gpu-run.sh patched python3 devjob/pays.py $OUT/pays $(( left - 15 )) > $OUT/pays.txt 2>&1
echo "pays rc=$? at $(el) s" >> $OUT/pays.txt
cd $OUT && gzip -f pays/*/server*.log 2>/dev/null; tar czf pays.tgz pays && rm -rf pays; true

#!/usr/bin/env bash
# drafting counters on air12, then 0850 sizing on / off under C128
set -x
start=$(date +%s)
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
JOB_DRAFTS=1 timeout 230 scripts/gpu-run.sh patched python3 results/W67-prefill-turns-chunk-gpu/job.py $OUT 540 > $OUT/run-drafts.txt 2>&1
echo "rc=$?" >> $OUT/run-drafts.txt
left=$(( 580 - $(date +%s) + start ))
timeout $left scripts/gpu-run.sh patched python3 results/W68-draft-counters-kv-sizing-c128/job_sizing.py $OUT $(( left - 20 )) > $OUT/run.txt 2>&1
echo "rc=$?" >> $OUT/run.txt
cd $OUT && gzip -f server-*.log; tar czf res.tgz drafts [0-9]-* 2>/dev/null; true

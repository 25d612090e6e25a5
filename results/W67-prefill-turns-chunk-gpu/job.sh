#!/usr/bin/env bash
# 0880 / 0890 beside a 120K prompt: three arms
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
JOB_TURNS=1 timeout 580 scripts/gpu-run.sh patched python3 results/W67-prefill-turns-chunk-gpu/job.py $OUT 555 > $OUT/run.txt 2>&1
echo "rc=$?" >> $OUT/run.txt
cd $OUT && gzip -f server-*.log; tar czf res.tgz turns-* 2>/dev/null; true

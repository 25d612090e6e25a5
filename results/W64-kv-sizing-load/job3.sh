#!/usr/bin/env bash
set -x
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
timeout 450 scripts/gpu-run.sh patched python3 devjob/kv_probe.py $OUT 430 > $OUT/kv.txt 2>&1
echo "rc=$?" >> $OUT/kv.txt
cd $OUT && gzip -f server-*.log; tar czf kv.tgz B-* A-* 2>/dev/null; true

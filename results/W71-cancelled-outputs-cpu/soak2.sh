#!/bin/bash
cd /work/main
for arm in 0 1; do
  scripts/serve.sh start --config /tmp/soak$arm.env > /tmp/w71-start$arm.log 2>&1 || { echo start failed; exit 1; }
  scripts/serve.sh soak --config /tmp/soak$arm.env --clients 8 --duration 10m --window soak-knob-$arm --results-dir /tmp/w71 > /tmp/w71-soak$arm.log 2>&1
  curl -s 127.0.0.1:813$arm/metrics | grep -E "^pb_outputs_unclaimed|^pb_output_handlers|^pb_requests_running" > /tmp/w71-gauges$arm.txt
  scripts/serve.sh stop --config /tmp/soak$arm.env >> /tmp/w71-start$arm.log 2>&1
done
echo done > /tmp/w71-done

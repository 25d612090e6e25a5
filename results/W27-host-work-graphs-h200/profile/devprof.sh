#!/usr/bin/env bash
# scratch: profile C32 sampled vs logprobs, streamed and not
pip install -q --no-index --target /tmp/spy .scratch/py_spy-*.whl; SPY=/tmp/spy/bin/py-spy
export $(PYTHONPATH=src python3 -c "from patchbay.runtime.config import knob_set; print(' '.join(f'{k}={v}' for k,v in knob_set('prod').items()))") PB_TENSOR_PARALLEL=0
mkdir -p $OUT/prof
bash scripts/gpu-run.sh patched python3 -m patchbay.device profiled $OUT/prof -- patchbay.device serve --port 8000 --cuda-graphs > $OUT/server.log 2>&1 &
for i in $(seq 300); do curl -sf localhost:8000/v1/models >/dev/null && break; sleep 2; done
PID=$(pgrep -f "patchbay.device profiled" | head -1); echo "pid $PID $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null) uid $(id -u)" > $OUT/info.txt
P=/tmp/pb-engine-patched:/tmp/pb-site:src
PYTHONPATH=$P python3 .scratch/load.py sampled 32 15 1 $OUT/warm.json
k=0
for phase in "sampled 1" "logprobs 1" "sampled 0" "logprobs 0"; do
  set -- $phase; k=$((k+1)); name=$k-$1-$2
  PYTHONPATH=$P python3 .scratch/load.py $1 32 50 $2 $OUT/$name.json &
  L=$!
  sleep 6
  if true; then timeout 40 $SPY record --pid $PID -d 18 -r 200 -t --idle -f raw -o $OUT/spy-$name.txt --nonblocking > $OUT/spy-$name.log 2>&1; else sleep 20; fi
  sleep 6
  n=$(ls $OUT/prof/window-*.json 2>/dev/null | wc -l)
  kill -USR1 $PID; for i in $(seq 50); do [ -f $OUT/prof/started-$n ] && break; sleep 0.2; done
  sleep 8; kill -USR2 $PID
  wait $L
  for i in $(seq 50); do [ -f $OUT/prof/window-$n.json ] && break; sleep 0.2; done
  cp $OUT/prof/window-$n.json $OUT/win-$name.json 2>/dev/null
done
grep -iE "error|Traceback" $OUT/server.log | head -20 > $OUT/server-errors.txt
tail -20 $OUT/server.log > $OUT/server-tail.txt; rm -f $OUT/server.log
cd $OUT && tar czf /tmp/all.tgz --exclude=prof . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/

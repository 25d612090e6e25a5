#!/usr/bin/env bash
M=.cache/models/trained-s0-c65536; [ -d $M ] || M=/tmp/trained
eval "$(PYTHONPATH=src python3 -c 'from patchbay.runtime.config import knob_set
for k, v in knob_set("prod").items(): print(f"export {k}={v!r}")')"
export PB_TENSOR_PARALLEL=0 PB_HOST_TIER_MB=0 DRAFT_JOB_DEVICE=cuda DRAFT_JOB_PHASES=sampled_alone,greedy_alone
for run in "0 0" "0 0" "8 0" "8 0"; do set -- $run
  PB_DRAFT_TOKENS=$1 PB_DRAFT_STREAMS=$2 timeout 60 scripts/gpu-run.sh patched python3 tests/draft_job.py $M 48 2>$OUT/err-$1.txt | tail -1 >> $OUT/dj.jsonl
done
python3 - <<'P'
import json, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/dj.jsonl")]
for r in rows: print([ (p, [len(x) for x in r[p]]) for p in ("sampled_alone","greedy_alone")], r["counts"]["sampled_alone"])
for i in range(1, len(rows)):
    for p in ("sampled_alone", "greedy_alone"):
        print(i, p, [a == b for a, b in zip(rows[0][p], rows[i][p])])
P

#!/usr/bin/env bash
# 0900 on this CPU: tests/draft_job.py, greedy and sampled alone, 96 tokens, the local set under torch's plain
# kernels, PB_DRAFT_TOKENS=8, PB_DRAFT_STREAMS=0, PB_DRAFT_BACKOFF=16, PB_DRAFT_PAYS 0 / 2 / 4;
# on synthetic:trained (copies: drafts kept) and the random synthetic:tiny (greedy replies loop).
set -e
out=${1:?OUT}; engine=${2:?ENGINE}; mkdir -p "$out"
eval "$(PYTHONPATH=src .venv/bin/python -c 'from patchbay.runtime.config import knob_set
for k, v in knob_set("local").items(): print(f"export {k}={v!r}")')"
export ATEN_CPU_CAPABILITY=default PB_DRAFT_TOKENS=8 PB_DRAFT_STREAMS=0 PB_DRAFT_BACKOFF=16
export DRAFT_JOB_PHASES=greedy_alone,sampled_alone
for model in trained-s0-c65536 tiny-s0-c65536; do
  for pays in 0 2 4; do
    PB_DRAFT_PAYS=$pays PYTHONPATH=$engine:src .venv/bin/python tests/draft_job.py .cache/models/$model 96 \
      > "$out/${model%%-*}-pays-$pays.json"
    echo "$model pays $pays done"
  done
done

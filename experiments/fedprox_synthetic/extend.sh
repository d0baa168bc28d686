#!/usr/bin/env bash
# Continue finished runs of run.sh to more rounds (a resume may raise train.rounds; the run is the same as
# one started with the larger number). Usage, from the repository root:
#   ROUNDS=100 experiments/fedprox_synthetic/extend.sh NAME...   (NAME: e.g. synthetic_1_1_fedavg_s0)
set -euo pipefail
here=experiments/fedprox_synthetic
for name in "$@"; do
  echo "$(date -u +%H:%M:%S) $name: python -m distfl train --resume runs/fedprox_synthetic/$name train.rounds=${ROUNDS:-100}"
  OMP_NUM_THREADS=1 python -m distfl train --resume "runs/fedprox_synthetic/$name" train.rounds="${ROUNDS:-100}" \
    > "$here/results/$name.extend.log" 2>&1
  cp "runs/fedprox_synthetic/$name/metrics.jsonl" "runs/fedprox_synthetic/$name/summary.json" "$here/results/$name/"
done

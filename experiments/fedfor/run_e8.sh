#!/usr/bin/env bash
# FedFOR (normalised default) against FedAvg, FedProx and FedAvgM (server momentum 0.5) at E = 8, 30 rounds,
# seeds 0 and 1 (evidence F4), two runs at a time. Skips a tag whose results/TAG holds a run that ended.
# Then: python experiments/fedfor/table.py --upto 30
#   PYTHON=.venv/bin/python experiments/fedfor/run_e8.sh
set -uo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
run() {  # TAG CONFIG overrides...
  if ended "experiments/fedfor/results/$1"; then echo "$1: done"; return; fi
  experiments/fedfor/run_one.sh "$@"
}
for seed in 0 1; do
  sfx=$([ "$seed" = 0 ] || echo "_s$seed")
  run fedfor_norm_E8$sfx fmnist_longtail_fedfor train.local_epochs=8 train.rounds=30 seed=$seed &
  run fedavg_E8$sfx      fmnist_longtail_fedavg train.local_epochs=8 train.rounds=30 seed=$seed &
  wait
  run fedprox_E8$sfx     fmnist_longtail_fedprox train.local_epochs=8 train.rounds=30 seed=$seed &
  run fedavgm0.5_E8$sfx  fmnist_longtail_fedavg train.local_epochs=8 train.rounds=30 seed=$seed server.momentum=0.5 &
  wait
done

#!/usr/bin/env bash
# Every run behind experiments/fedfor/results.md, one at a time (the machine is shared: 2 cores, nice 10).
# Skips a tag whose results/TAG holds a run that ended (experiments/lib.sh; delete it to rerun).
#   experiments/fedfor/run_all.sh
set -uo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
run() {  # TAG CONFIG overrides...
  if ended "experiments/fedfor/results/$1"; then echo "$1: done"; return; fi
  experiments/fedfor/run_one.sh "$@"
}
rounds() { case $1 in 1) echo 60;; 2) echo 40;; 4) echo 30;; esac; }
for E in 1 2 4; do
  R=$(rounds $E)
  run fedavg_E$E       fmnist_longtail_fedavg  train.local_epochs=$E train.rounds=$R
  run fedfor_E$E       fmnist_longtail_fedfor  train.local_epochs=$E train.rounds=$R
  run fedprox_E$E      fmnist_longtail_fedprox train.local_epochs=$E train.rounds=$R
  run fedfor_a0.5_E$E  fmnist_longtail_fedfor  train.local_epochs=$E train.rounds=$R algorithm.fedfor_alpha=0.5
done
run fedfor_gt_E4       fmnist_longtail_fedfor_gt train.local_epochs=4 train.rounds=30
run fedfor_gt_a0.5_E4  fmnist_longtail_fedfor_gt train.local_epochs=4 train.rounds=30 algorithm.fedfor_alpha=0.5
# alpha sweep at E = 1 (boundary ge)
for A in 0.25 1 2; do
  run fedfor_a${A}_E1  fmnist_longtail_fedfor  train.local_epochs=1 train.rounds=60 algorithm.fedfor_alpha=$A
done

#!/usr/bin/env bash
# A second seed (new model init, new longtail clients, new batch orders) for the main comparisons.
set -uo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
run() {
  if ended "experiments/fedfor/results/$1"; then echo "$1: done"; return; fi
  experiments/fedfor/run_one.sh "$@"
}
run fedfor_E1_s1        fmnist_longtail_fedfor train.local_epochs=1 train.rounds=60 seed=1
for E in 1 4; do
  R=$([ $E = 1 ] && echo 60 || echo 30)
  run fedavg_E${E}_s1      fmnist_longtail_fedavg train.local_epochs=$E train.rounds=$R seed=1
  run fedavgm0.5_E${E}_s1  fmnist_longtail_fedavg train.local_epochs=$E train.rounds=$R seed=1 server.momentum=0.5
  run fedfor_a0.5_E${E}_s1 fmnist_longtail_fedfor train.local_epochs=$E train.rounds=$R seed=1 algorithm.fedfor_alpha=0.5
done

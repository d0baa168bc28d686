#!/usr/bin/env bash
# A control added after the first results: is FedFOR with small alpha just server momentum?
# FedAvgM (server sgd, momentum 0.5, lr 1) on the same clients, E = 1 and E = 4.
set -uo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
run() {
  if ended "experiments/fedfor/results/$1"; then echo "$1: done"; return; fi
  experiments/fedfor/run_one.sh "$@"
}
run fedavgm0.5_E1 fmnist_longtail_fedavg train.local_epochs=1 train.rounds=60 server.momentum=0.5
run fedavgm0.5_E4 fmnist_longtail_fedavg train.local_epochs=4 train.rounds=30 server.momentum=0.5

#!/usr/bin/env bash
# MOON and FedExP against FedAvg on Fashion-MNIST, Dir(0.1) label skew, 100 clients (10 a round), on one
# network (simplecnn + a 256-d projection head), seeds 0 and 1 (each seed: its own split, init, cohorts).
# Also MOON at mu = 5 (the paper's CIFAR-10 value), seed 0 only; and FedAvg and MOON nearer the MOON paper's
# regime: 10 clients, all sampled every round, 25 rounds, seed 0 only.
# Usage: experiments/baselines/run_moon_fedexp.sh. Then: python experiments/baselines/table_moon_fedexp.py
set -euo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
OUT=experiments/baselines/moon_fedexp
runs=("fedavg 0" "moon 0" "fedexp 0" "fedavg 1" "moon 1" "fedexp 1" "moon_mu5 0")
for run in "${runs[@]}"; do
    read -r method seed <<< "$run"
    dir="$OUT/${method}_seed${seed}"
    if ended "$dir"; then echo "$dir: done"; continue; fi
    if [ "$method" = moon_mu5 ]; then args=(algorithm.name=moon algorithm.moon_mu=5); else args=("algorithm.name=$method"); fi
    cmd=(python -m distfl train configs/baselines/fmnist_dir01_projection.yaml "${args[@]}" "seed=$seed"
         "output.dir=$dir")
    mkdir -p "$dir"
    echo "${cmd[*]}" > "$dir.command.txt"
    echo ">> ${cmd[*]}"
    nice "${cmd[@]}" --overwrite 2>&1 | tail -2
done
for method in fedavg moon; do
  dir="$OUT/${method}_10clients_seed0"
  if ended "$dir"; then echo "$dir: done"; continue; fi
  cmd=(python -m distfl train configs/baselines/fmnist_dir01_projection.yaml "algorithm.name=$method" seed=0
       partition.num_clients=10 train.clients_per_round=10 train.rounds=25 checkpoint.every=0 "output.dir=$dir")
  mkdir -p "$dir"
  echo "${cmd[*]}" > "$dir.command.txt"
  echo ">> ${cmd[*]}"
  nice "${cmd[@]}" --overwrite 2>&1 | tail -2
done

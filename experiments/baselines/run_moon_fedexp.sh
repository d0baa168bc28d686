#!/usr/bin/env bash
# MOON and FedExP against FedAvg on Fashion-MNIST, Dir(0.1) label skew, 100 clients (10 a round), on one
# network (simplecnn + a 256-d projection head), seeds 0 and 1 (each seed: its own split, init, cohorts).
# Usage: experiments/baselines/run_moon_fedexp.sh. Then: python experiments/baselines/table_moon_fedexp.py
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=experiments/baselines/moon_fedexp
for seed in 0 1; do
  for method in fedavg moon fedexp; do
    dir="$OUT/${method}_seed${seed}"
    if [ -f "$dir/summary.json" ]; then echo "$dir: done"; continue; fi
    cmd=(python -m distfl train configs/baselines/fmnist_dir01_projection.yaml "algorithm.name=$method" "seed=$seed"
         "output.dir=$dir")
    mkdir -p "$dir"
    echo "${cmd[*]}" > "$dir.command.txt"
    echo ">> ${cmd[*]}"
    nice "${cmd[@]}" --overwrite 2>&1 | tail -2
  done
done

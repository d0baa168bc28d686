#!/usr/bin/env bash
# FedProx's synthetic federations: FedAvg and FedProx (mu = 1) on each, seeds given (default 0 1).
# FedProx with mu = 0 equals FedAvg bit for bit without stragglers (README.md), so it is not run twice.
# Usage, from the repository root: [ROUNDS=200] [DATA="synthetic_1_1 ..."] experiments/fedprox_synthetic/run.sh [SEEDS...]
# (the committed results ran the paper's 200 rounds, seeds 0 and 1; DATA picks federations, default all four).
# Each run writes runs/fedprox_synthetic/NAME_METHOD_sSEED and copies its metrics.jsonl and summary.json
# to experiments/fedprox_synthetic/results/, beside its log and the command that ran it (NAME.cmd).
set -euo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
here=experiments/fedprox_synthetic
seeds=${*:-0 1}
mkdir -p "$here/results"
for seed in $seeds; do
  for data in ${DATA:-synthetic_1_1 synthetic_iid synthetic_0_0 synthetic_0.5_0.5}; do
    for method in fedavg fedprox_mu1; do
      name=${data}_${method}_s${seed}
      ended "$here/results/$name" && continue
      args=(seed="$seed" train.rounds="${ROUNDS:-200}" output.dir="runs/fedprox_synthetic/$name")
      [ "$method" = fedprox_mu1 ] && args+=(algorithm.name=fedprox algorithm.mu=1.0)
      echo "$(date -u +%H:%M:%S) $name: python -m distfl train $here/configs/$data.yaml ${args[*]}"
      echo "python -m distfl train $here/configs/$data.yaml ${args[*]}" > "$here/results/$name.cmd"
      OMP_NUM_THREADS=1 python -m distfl train "$here/configs/$data.yaml" "${args[@]}" --overwrite > "$here/results/$name.log" 2>&1
      mkdir -p "$here/results/$name"
      cp "runs/fedprox_synthetic/$name/metrics.jsonl" "runs/fedprox_synthetic/$name/summary.json" "$here/results/$name/"
    done
  done
done

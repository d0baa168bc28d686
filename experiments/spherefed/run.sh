#!/usr/bin/env bash
# SphereFed on real Fashion-MNIST: FedAvg (+ FFC on its cross-entropy features) and SphereFed (+ FFC),
# at iid, Dirichlet 0.5 and Dirichlet 0.1, 10 clients. Each run reports its model before and after FFC.
# Usage: experiments/spherefed/run.sh [extra overrides, e.g. seed=1]. Then: python experiments/spherefed/table.py
set -euo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
OUT=experiments/spherefed/results
EXTRA=("$@")
TAG=$(printf '%s' "${EXTRA[*]:-}" | tr ' =' '_-')
for skew in iid 0.5 0.1; do
  if [ "$skew" = iid ]; then part="partition.scheme=iid"; else part="partition.alpha=$skew"; fi
  for method in fedavg sphere; do
    dir="$OUT/${method}_${skew}${TAG:+_$TAG}"
    if ended "$dir"; then echo "$dir: done"; continue; fi
    cmd=(python -m distfl train "configs/paper/spherefed/fmnist_${method}.yaml" "$part" "output.dir=$dir"
         output.progress=log output.tensorboard=false "${EXTRA[@]}")
    mkdir -p "$dir"
    echo "${cmd[*]}" > "$dir.command.txt"
    echo ">> ${cmd[*]}"
    nice "${cmd[@]}" --overwrite 2>&1 | tail -3
  done
done

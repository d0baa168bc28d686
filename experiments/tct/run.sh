#!/usr/bin/env bash
# TCT on real Fashion-MNIST at a budget that fits 2 CPU cores (what differs from the paper's schedule in
# configs/paper/tct/fmnist.yaml): stage 1 has 10 rounds instead of 100 (5 local epochs, as the paper);
# p = 4,096 random coordinates instead of all 44,426; stage-2 products in float32. Stage 2 is the
# paper's: 100 rounds, M = 500, eta = 5e-5, SCAFFOLD, normalised features.
# Usage: experiments/tct/run.sh [extra overrides]. Table: python experiments/tct/table.py
set -euo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
OUT=experiments/tct/results
REDUCED=(train.rounds=10 tct.p=4096 tct.compute_dtype=float32 eval.every=5 checkpoint.every=20)
declare -A SETTINGS=(
  [C1]="partition.scheme=n_classes partition.classes_per_client=1"
  [C2]="partition.scheme=n_classes partition.classes_per_client=2"
  [a0.1]="partition.scheme=dirichlet partition.alpha=0.1"
  [a0.5]="partition.scheme=dirichlet partition.alpha=0.5"
)
for name in C1 C2 a0.1 a0.5; do
  dir="$OUT/$name"
  if ended "$dir"; then echo "$dir: done"; continue; fi
  if [ -f "$dir/checkpoints/latest" ]; then  # interrupted: continue from its last checkpoint
    echo ">> resume $dir"
    OMP_NUM_THREADS=1 nice torchrun --standalone --nproc_per_node=2 -m distfl train --resume "$dir" >> "$OUT/$name.log" 2>&1 \
      || echo "$name failed (see $OUT/$name.log)"
    tail -2 "$OUT/$name.log"; continue
  fi
  # shellcheck disable=SC2206
  cmd=(torchrun --standalone --nproc_per_node=2 -m distfl train configs/paper/tct/fmnist.yaml ${SETTINGS[$name]}
       "${REDUCED[@]}" "output.dir=$dir" output.progress=log output.tensorboard=false "$@")
  mkdir -p "$OUT"
  echo "${cmd[*]}" > "$OUT/$name.command.txt"
  echo ">> ${cmd[*]}"
  OMP_NUM_THREADS=1 nice "${cmd[@]}" --overwrite > "$OUT/$name.log" 2>&1 || echo "$name failed (see $OUT/$name.log)"
  tail -2 "$OUT/$name.log"
done

#!/usr/bin/env bash
# Does input normalisation matter for TCT? FMNIST #C=1 at a small budget (2 busy CPU cores): stage 1 is
# 5 rounds of FedAvg with 1 local epoch; stage 2 is the paper's (100 rounds, M = 500, eta = 5e-5) on p = 4,096
# coordinates in float32. Each seed runs once with data.normalize=none (pixels in [0, 1], distfl's FMNIST
# default) and once with data.normalize=mean_std (training mean 0.2860 / std 0.3530, as the TCT authors'
# FMNIST calibration code). One process, sequential, niced.
# Usage: experiments/tct/run_inputnorm.sh [seed ...]   (default: 0 1). Results: experiments/tct/results_inputnorm/
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs/inputnorm}
KEEP=experiments/tct/results_inputnorm
PY=${PY:-/work/main/.venv/bin/python}
SETTING=(partition.classes_per_client=1 train.rounds=5 train.local_epochs=1 tct.p=4096 tct.compute_dtype=float32
         tct.feature_dtype=float32 eval.every=5 checkpoint.every=20 output.progress=log output.tensorboard=false)
seeds=("$@"); [ ${#seeds[@]} -gt 0 ] || seeds=(0 1)
for seed in "${seeds[@]}"; do
  for norm in none mean_std; do
    name="C1_${norm}_seed${seed}"
    if [ -f "$KEEP/$name/summary.json" ]; then echo "$name: done"; continue; fi
    cmd=("$PY" -m distfl train configs/paper/tct/fmnist.yaml "${SETTING[@]}" "data.normalize=$norm" "seed=$seed"
         "output.dir=$RUNS/$name")
    mkdir -p "$RUNS" "$KEEP/$name"
    if grep -qs '"status": "completed"' "$RUNS/$name/summary.json"; then
      echo "$name: finished in $RUNS, copying it"  # e.g. a run that outlived this script
    else
      echo ">> ${cmd[*]}"
      PYTHONPATH=$PWD OMP_NUM_THREADS=1 nice -n 10 "${cmd[@]}" --overwrite > "$RUNS/$name.log" 2>&1 || { echo "$name failed (see $RUNS/$name.log)"; continue; }
    fi
    echo "PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 10 ${cmd[*]} --overwrite" > "$KEEP/$name/command.txt"
    cp "$RUNS/$name/summary.json" "$RUNS/$name/metrics.jsonl" "$KEEP/$name/"
    tail -1 "$RUNS/$name.log"
  done
done

#!/usr/bin/env bash
# CCVR beside FFC on real Fashion-MNIST, on the same trained FedAvg models: the FedAvg config of
# experiments/spherefed (10 clients, all every round, SimpleCNN, 20 rounds x 1 local epoch, Dir(alpha))
# trained once with calibration.method=ccvr; then a copy of the run directory, cut back to its last
# training round's checkpoint, is resumed with calibration.method=ffc (FFC at the paper's lambda = 0).
#   experiments/ccvr/run.sh 0.1 "0 1"       # Dir(0.1), seeds 0 and 1
#   python experiments/ccvr/table.py 0.1    # the table (experiments/ccvr/results.md)
set -euo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
alpha=${1:-0.1}; seeds=${2:-"0 1"}
OUT=experiments/ccvr/results
PY=${PYTHON:-python}
for seed in $seeds; do
  dir=$OUT/fedavg_${alpha}_s${seed}
  if ! ended "$dir"; then
    cmd=(-m distfl train configs/paper/spherefed/fmnist_fedavg.yaml "partition.alpha=$alpha" "seed=$seed"
         calibration.method=ccvr "output.dir=$dir" output.progress=log output.tensorboard=false)
    mkdir -p "$OUT"; echo "python ${cmd[*]}" > "$dir.command.txt"
    echo ">> python ${cmd[*]}"
    OMP_NUM_THREADS=1 nice "$PY" "${cmd[@]}" --overwrite > "$dir.log" 2>&1 || { echo "FAILED $dir (see $dir.log)"; continue; }
  fi
  ffc=${dir}_ffc
  if ! ended "$ffc"; then
    rm -rf "$ffc"; cp -r "$dir" "$ffc"; rm -rf "$ffc"/checkpoints/ccvr_*
    ls "$ffc/checkpoints" | grep '^round_' | sort | tail -1 > "$ffc/checkpoints/latest"
    cmd=(-m distfl train --resume "$ffc" calibration.method=ffc calibration.ridge=0.0)
    echo "cp -r $dir $ffc; rm -rf $ffc/checkpoints/ccvr_*; (the last round_ checkpoint into $ffc/checkpoints/latest); python ${cmd[*]}" > "$ffc.command.txt"
    echo ">> python ${cmd[*]}"
    OMP_NUM_THREADS=1 nice "$PY" "${cmd[@]}" > "$ffc.log" 2>&1 || echo "FAILED $ffc (see $ffc.log)"
  fi
  rm -rf "$dir/checkpoints" "$ffc/checkpoints"
done

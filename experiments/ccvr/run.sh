#!/usr/bin/env bash
# CCVR beside FFC on real Fashion-MNIST: the FedAvg runs of experiments/spherefed (10 clients, all every
# round, SimpleCNN, 20 rounds x 1 local epoch, Dir(alpha)) with calibration.method=ccvr instead of ffc.
# The trained model is the same bits as the spherefed run of that seed (same config up to the phase), so
# its test_acc_before is FedAvg's and the two calibrations compare on the same features.
#   experiments/ccvr/run.sh 0.1 "0 1"       # Dir(0.1), seeds 0 and 1
#   python experiments/ccvr/table.py        # the table (experiments/ccvr/results.md)
set -euo pipefail
cd "$(dirname "$0")/../.."
alpha=${1:-0.1}; seeds=${2:-"0 1"}
OUT=experiments/ccvr/results
for seed in $seeds; do
  dir=$OUT/fedavg_${alpha}_s${seed}
  if [ -f "$dir/summary.json" ]; then echo "$dir: done"; continue; fi
  cmd=(python -m distfl train configs/paper/spherefed/fmnist_fedavg.yaml "partition.alpha=$alpha" "seed=$seed"
       calibration.method=ccvr "output.dir=$dir" output.progress=log output.tensorboard=false)
  mkdir -p "$OUT"; echo "${cmd[*]}" > "$dir.command.txt"
  echo ">> ${cmd[*]}"
  OMP_NUM_THREADS=1 nice "${PYTHON:-python}" "${cmd[@]:1}" --overwrite > "$dir.log" 2>&1 || echo "FAILED $dir (see $dir.log)"
  rm -rf "$dir/checkpoints"
done

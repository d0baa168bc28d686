#!/bin/bash
# The evidence rows of docs/system.md (docs/evidence.md, rows D1-D3). From the repository root:
#   experiments/system/run.sh buff SEED         # sync FedAvg vs FedBuff under heterogeneous speeds
#   [LEVELS="90 50 0"] [ROUNDS=200] experiments/system/run.sh stragglers SEED
#       FedProx's Synthetic(1,1): FedAvg (drops stragglers) vs FedProx mu 0 and mu 1 (partial work). The committed
#       runs (runs/synthetic_*): seeds 0, 1 and 2 `ROUNDS=200 LEVELS="90 50"` (the paper's 200 rounds); the 0%
#       rows are X1's 200-round runs (experiments/fedprox_synthetic: the same federation and models, seeds 0
#       and 1), so LEVELS=0 was not run here
#   experiments/system/run.sh stragglers_fmnist SEED   # the same comparison transferred to FMNIST (deadline, speeds)
set -e
. "$(dirname "$0")/../lib.sh"  # ended DIR
what=$1; seed=${2:-0}
out=experiments/system/runs
mkdir -p "$out"
run() {  # name, config, overrides...
  local name=$1 config=$2; shift 2
  ended "$out/$name" && return
  echo "python -m distfl train $config seed=$seed output.dir=$out/$name $*" > "$out/$name.cmd"
  python -m distfl train "$config" seed=$seed output.dir="$out/$name" --overwrite "$@" > "$out/$name.log" 2>&1
}
if [ "$what" = buff ]; then
  run "sync_s$seed" experiments/system/fmnist_heterogeneous.yaml
  run "fedbuff_s$seed" experiments/system/fmnist_heterogeneous.yaml system.async_mode=fedbuff \
      system.concurrency=20 system.buffer_size=10 system.staleness=polynomial system.staleness_a=0.5
elif [ "$what" = stragglers ]; then
  for level in ${LEVELS:-90 50 0}; do
    share="$(python -c "print($level / 100)") train.rounds=${ROUNDS:-200}"
    run "synthetic_fedavg_drop_${level}_s$seed" experiments/system/synthetic_stragglers.yaml system.stragglers=$share
    # without stragglers FedProx mu 0 is FedAvg, bit for bit (tests/methods/test_algorithms.py): not run twice
    [ $level = 0 ] || run "synthetic_fedprox0_partial_${level}_s$seed" experiments/system/synthetic_stragglers.yaml \
        system.stragglers=$share algorithm.name=fedprox algorithm.options.mu=0 system.partial_work=true
    run "synthetic_fedprox1_partial_${level}_s$seed" experiments/system/synthetic_stragglers.yaml system.stragglers=$share \
        algorithm.name=fedprox algorithm.options.mu=1 system.partial_work=true
  done
elif [ "$what" = stragglers_fmnist ]; then
  for level in 50 90; do
    if [ $level = 50 ]; then speeds="list:1,1,1,1,1,3,5,7,9,11"; else speeds="list:1,3,5,7,9,11,13,15,17,19"; fi
    run "fedavg_drop_${level}_s$seed" experiments/system/fmnist_stragglers.yaml system.speed=$speeds
    run "fedprox0_partial_${level}_s$seed" experiments/system/fmnist_stragglers.yaml system.speed=$speeds \
        algorithm.name=fedprox algorithm.options.mu=0 system.partial_work=true
    run "fedprox1_partial_${level}_s$seed" experiments/system/fmnist_stragglers.yaml system.speed=$speeds \
        algorithm.name=fedprox algorithm.options.mu=1 system.partial_work=true
  done
fi

#!/usr/bin/env bash
# Per-FedAvg's alpha searched as pFedMe's personal lr was (pfedme_search.sh): 20 rounds of the all-methods
# protocol, Dir(0.1), seed 0, first-order, beta = the protocol's lr 0.05; alpha 0.01 (the default) is the
# 100-round run's round-20 evaluation (runs/dir01_perfedavg_s0: the lr is constant, so its first 20 rounds are
# this run). Runs land in experiments/all_methods/perfedavg_search/dir01_alpha<alpha>/.
#   experiments/all_methods/perfedavg_search.sh "0.003 0.03 0.1"
set -u
. "$(dirname "$0")/../lib.sh"  # ended DIR: a run that ended is skipped
cd "$(dirname "$0")/../.."
for alpha in ${1:-0.003 0.03 0.1}; do
  out=experiments/all_methods/perfedavg_search/dir01_alpha$alpha
  ended "$out" && continue
  cmd="python -m distfl train experiments/personal/fmnist.yaml train.rounds=20 eval.every=10 algorithm.name=perfedavg algorithm.options.alpha=$alpha partition.scheme=dirichlet partition.alpha=0.1 seed=0 output.dir=$out"
  echo "$cmd" > "$out.cmd.txt"
  # shellcheck disable=SC2086
  OMP_NUM_THREADS=1 ${PYTHON:-python} ${cmd#python } --overwrite > "$out.log" 2>&1 || echo "FAILED $out (see $out.log)"
  rm -rf "$out/checkpoints"
done

#!/usr/bin/env bash
# FedAvg + fine-tuning (eval.finetune_epochs=5), FedBABU's baseline, on experiments/personal/'s protocol:
# Fashion-MNIST, 100 clients, 10 a round, 20 rounds, Dir(0.1) and #C=2, seeds 0 and 1. Evaluated at
# round 20 only (eval.every=20): the global model is the plain FedAvg run's, bit for bit.
#   experiments/finetune/run.sh         # runs land in runs/finetune/<split>_fedavgft_s<seed>/
set -u
. "$(dirname "$0")/../lib.sh"  # ended DIR
for spec in "dir01 0" "c2 0" "dir01 1" "c2 1"; do
  set -- $spec; split=$1; seed=$2
  case $split in
    dir01) part="partition.scheme=dirichlet partition.alpha=0.1" ;;
    c2) part="partition.scheme=n_classes partition.classes_per_client=2" ;;
  esac
  out=runs/finetune/${split}_fedavgft_s${seed}
  ended "$out" && continue
  PYTHONPATH=. OMP_NUM_THREADS=1 ${PYTHON:-python} -m distfl train experiments/personal/fmnist.yaml \
    algorithm.name=fedavg eval.finetune_epochs=5 eval.every=20 $part seed=$seed output.dir=$out --overwrite
done

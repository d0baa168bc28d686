#!/bin/bash
# Runs NIID-Bench's FMNIST rows with distfl sweep (resumable: rerun this script after a stop).
# Usage: experiments/niid_bench/run.sh [OUT]   (default OUT: experiments/niid_bench/runs)
# algorithm.mu is fedprox's only: the sweep applies it where declared, see below.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-experiments/niid_bench/runs}
PY=${PYTHON:-python}
for seed in 0 1; do
  for part in C2 dir05 qty05; do
    case $part in
      C2)    P="partition.scheme=n_classes partition.classes_per_client=2" ;;
      dir05) P="partition.scheme=dirichlet partition.alpha=0.5" ;;
      qty05) P="partition.scheme=quantity partition.alpha=0.5" ;;
    esac
    for alg in fedavg fedprox scaffold fednova; do
      MU=""; [ $alg = fedprox ] && MU="algorithm.mu=0.01"
      $PY -m distfl sweep experiments/niid_bench/niid_bench.yaml $P algorithm.name=$alg $MU \
        output.dir=$OUT/$part/$alg --seeds $seed || echo "FAILED $part $alg seed $seed"
    done
  done
done

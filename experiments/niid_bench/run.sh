#!/bin/bash
# Runs NIID-Bench's FMNIST rows with distfl sweep (resumable: rerun this script after a stop).
# Usage: experiments/niid_bench/run.sh [OUT]   (default OUT: experiments/niid_bench/runs)
# A subset: SEEDS="1" PARTS="C2" RUNS="fedavg fednova" experiments/niid_bench/run.sh
# (default: PARTS="C2 dir05 qty05", rows N1-N3; N4 adds PARTS="C1 C3 iid", the homogeneous split as iid)
# EXTRA="k=v ..." adds overrides to every run (run_gpu.sh passes the GPU settings this way).
# algorithm.mu is fedprox's only: the sweep applies it where declared, see below.
# SCAFFOLD runs twice: `scaffold` (distfl's default, c - c_i added to the gradient, so through momentum)
# and `scaffold_nb` (algorithm.scaffold_correction=weights: NIID-Bench's code, w -= lr (c - c_i) after
# each step, outside momentum and weight decay); README "Readings", item 6.
set -u
cd "$(dirname "$0")/../.."
OUT=${1:-experiments/niid_bench/runs}
PY=${PYTHON:-python}
for seed in ${SEEDS:-0 1}; do
  for part in ${PARTS:-C2 dir05 qty05}; do
    case $part in
      C1|C2|C3) P="partition.scheme=n_classes partition.classes_per_client=${part#C}" ;;
      iid)   P="partition.scheme=iid" ;;
      dir05) P="partition.scheme=dirichlet partition.alpha=0.5" ;;
      qty05) P="partition.scheme=quantity partition.alpha=0.5" ;;
      *)     echo "unknown part $part (C1 C2 C3 dir05 qty05 iid)"; exit 2 ;;
    esac
    for run in ${RUNS:-fedavg fedprox scaffold scaffold_nb fednova}; do
      case $run in
        fedprox)     A="algorithm.name=fedprox algorithm.mu=0.01" ;;
        scaffold_nb) A="algorithm.name=scaffold algorithm.scaffold_correction=weights" ;;
        *)           A="algorithm.name=$run" ;;
      esac
      $PY -m distfl sweep experiments/niid_bench/niid_bench.yaml $P $A ${EXTRA:-} \
        output.dir=$OUT/$part/$run --seeds $seed || echo "FAILED $part $run seed $seed"
    done
  done
done

#!/bin/bash
# The evidence rows of docs/compression.md (docs/evidence.md, rows U1-U3). From the repository root:
#   [JOBS=2] [ROUNDS=50] experiments/compression/run.sh SEED [NAME ...]
# runs, on experiments/compression/fmnist.yaml (the quickstart's setting on a virtual clock with slow uploads):
#   fedavg              uncompressed float32 updates
#   topk1, topk1_ef     top-k at 1% density, without and with error feedback (Stich et al. 2018's memory)
#   topk10, topk10_ef   top-k at 10%
#   qsgd2, qsgd4, qsgd8 QSGD at 2, 4 and 8 bits a coordinate (FedPAQ's quantiser; no error feedback)
# (all of them, or the NAMEs given), JOBS at a time, each with one thread at nice 10. A run that ended is skipped.
# Then: python experiments/compression/table.py > experiments/compression/results.md
set -e
. "$(dirname "$0")/../lib.sh"  # run_each
seed=${1:?usage: run.sh SEED [NAME ...]}; shift
names=${*:-fedavg topk1_ef topk1 topk10_ef topk10 qsgd2 qsgd4 qsgd8}
overrides() {  # name -> the compression keys of that run
  case $1 in
    fedavg) echo "" ;;
    topk1) echo "compression.up=topk compression.density=0.01" ;;
    topk1_ef) echo "compression.up=topk compression.density=0.01 compression.error_feedback=true" ;;
    topk10) echo "compression.up=topk compression.density=0.1" ;;
    topk10_ef) echo "compression.up=topk compression.density=0.1 compression.error_feedback=true" ;;
    qsgd2|qsgd4|qsgd8) echo "compression.up=qsgd compression.bits=${1#qsgd}" ;;
    *) echo "run.sh: unknown run name '$1' (valid: fedavg topk1 topk1_ef topk10 topk10_ef qsgd2 qsgd4 qsgd8)" >&2
       return 1 ;;
  esac
}
EXTRA="train.rounds=${ROUNDS:-50}" run_each experiments/compression/fmnist.yaml experiments/compression/runs "$seed" $names

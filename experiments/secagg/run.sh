#!/bin/bash
# The evidence rows of docs/secagg.md (docs/evidence.md, rows V1-V2). From the repository root:
#   [JOBS=2] [EPSILON=4] experiments/secagg/run.sh SEED [NAME ...]
# runs, on experiments/secagg/fmnist.yaml (100 clients, all of them every round), each calibrated to
# privacy.target_epsilon=EPSILON at delta 1e-3 over the config's rounds:
#   central            central DP-FedAvg (Gaussian noise added by the server; cohort poisson at rate 1, so the
#                      accountant composes unamplified add/remove-one rounds, as the distributed accountant does)
#   ddgauss20 ... 10   the distributed discrete Gaussian under secure aggregation (SecAgg's complete graph) at
#                      20, 18, 16, 14, 12 and 10 bits, the grid's scale_bits from experiments/secagg/scale.py
# (all of them, or the NAMEs given), JOBS at a time, each with one thread at nice 10. A run that ended is skipped.
# Then: python experiments/secagg/table.py > experiments/secagg/results.md
set -e
. "$(dirname "$0")/../lib.sh"  # run_each
seed=${1:?usage: run.sh SEED [NAME ...]}; shift
names=${*:-central ddgauss20 ddgauss18 ddgauss16 ddgauss14 ddgauss12 ddgauss10}
common="privacy.target_epsilon=${EPSILON:-4}"
overrides() {  # name -> the privacy and secagg keys of that run
  case $1 in
    central) echo "privacy.mechanism=gaussian privacy.secure_noise=false train.cohort=poisson $common" ;;
    ddgauss[0-9]*)
      local bits=${1#ddgauss} keys="privacy.mechanism=ddgauss train.cohort=random $common"
      echo "$keys secagg.bits=$bits secagg.scale_bits=$(python experiments/secagg/scale.py "$bits" $keys)" ;;
    *) echo "run.sh: unknown run name '$1' (valid: central, ddgauss followed by the bits, e.g. ddgauss16)" >&2
       return 1 ;;
  esac
}
run_each experiments/secagg/fmnist.yaml experiments/secagg/runs "$seed" $names

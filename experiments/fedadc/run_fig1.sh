#!/usr/bin/env bash
# FedADC Experiment A (Fig. 1) transferred to Fashion-MNIST: configs/paper/fedadc/fmnist_fig1.yaml
# (shards s = 2, 100 clients, 20 a round, H = 8 steps of batch 64, weight decay 4e-4).
#   run_fig1.sh grid            seed 0, the paper's per-method grid: train.lr in {0.01, 0.025, 0.05, 0.1}
#                               x beta in {0.6, 0.7, 0.8, 0.9} for SlowMo and FedADC (nesterov), lr alone
#                               for FedAvg; two streams side by side (one run per core)
#   run_fig1.sh seeds LR_AVG LR_SLOWMO:B LR_ADC:B
#                               each method at its seed-0 best on seeds 1 (and FedADC+ lambda = 0.35 at
#                               FedADC's best on seeds 0 and 1)
# ROUNDS (default 150) sets the round budget, LRS the grid's lrs. Every sweep resumes: rerun the same line after a stop.
# Table: python experiments/fedadc/table_fig1.py
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python}
S=${RUNS:-runs/evidence}/fedadc_fig1
R=${ROUNDS:-150}
export OMP_NUM_THREADS=1
sweep() { local name=$1; shift
  "$py" -m distfl sweep configs/paper/fedadc/fmnist_fig1.yaml output.dir=$S/$name train.rounds=$R "$@"; }
adc() { echo "algorithm.name=fedadc algorithm.variant=nesterov algorithm.beta_local=$1 algorithm.beta_global=$1"; }
LRS=${LRS:-0.01,0.025,0.05,0.1}  # the grid's local lrs (LRS=0.025,0.05,0.1 drops 0.01, see results.md)
case "${1:-}" in
  grid)
    ( sweep fedavg --grid train.lr=$LRS --seeds 0
      for b in 0.6 0.7 0.8 0.9; do sweep slowmo_b$b algorithm.name=slowmo algorithm.beta_global=$b --grid train.lr=$LRS --seeds 0; done ) &
    ( for b in 0.6 0.7 0.8 0.9; do sweep fedadc_b$b $(adc $b) --grid train.lr=$LRS --seeds 0; done ) &
    wait ;;
  seeds)
    avg=${2:?LR_AVG}; slowmo=${3:?LR_SLOWMO:BETA}; fedadc=${4:?LR_ADC:BETA}
    ( sweep fedavg --grid train.lr=$avg --seeds 1
      sweep slowmo_b${slowmo#*:} algorithm.name=slowmo algorithm.beta_global=${slowmo#*:} --grid train.lr=${slowmo%:*} --seeds 1 ) &
    ( sweep fedadc_b${fedadc#*:} $(adc ${fedadc#*:}) --grid train.lr=${fedadc%:*} --seeds 1
      sweep fedadc_plus_b${fedadc#*:} $(adc ${fedadc#*:}) algorithm.kd_lambda=0.35 --grid train.lr=${fedadc%:*} --seeds 0,1 ) &
    wait ;;
  *) echo "usage: $0 grid | seeds LR_AVG LR_SLOWMO:BETA LR_ADC:BETA" >&2; exit 2 ;;
esac

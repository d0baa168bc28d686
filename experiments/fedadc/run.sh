#!/usr/bin/env bash
# Run the FedADC study configs one at a time (the machine is shared), niced.
#   experiments/fedadc/run.sh SEED BETA [METHOD ...]
# writes runs/fedadc/s${SEED}_b${BETA}/<method>/ and appends one line per run to experiments/fedadc/runs.log
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-python}  # the Python with distfl installed (e.g. PY=.venv/bin/python)
SEED=${1:?seed}; BETA=${2:?beta}; shift 2
METHODS=${*:-fedavg slowmo fedadc_nesterov fedadc_heavy_ball fedadc_plus}
for m in $METHODS; do
  out=runs/fedadc/s${SEED}_b${BETA}/$m
  args=("seed=$SEED" "output.dir=$out")
  case $m in
    slowmo) args+=("algorithm.beta_global=$BETA") ;;
    fedadc_*) args+=("algorithm.beta_local=$BETA" "algorithm.beta_global=$BETA") ;;
  esac
  cmd="nice -n 10 $PY -m distfl train configs/paper/fedadc/$m.yaml ${args[*]} --overwrite"
  echo "$(date -Is) START $cmd" | tee -a experiments/fedadc/runs.log
  start=$(date +%s)
  $cmd > "experiments/fedadc/logs/s${SEED}_b${BETA}_$m.log" 2>&1
  echo "$(date -Is) DONE  $m seed=$SEED beta=$BETA wall=$(( $(date +%s) - start ))s" | tee -a experiments/fedadc/runs.log
done

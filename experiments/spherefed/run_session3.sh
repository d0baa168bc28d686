#!/usr/bin/env bash
# Session 3 of the SphereFed evidence: a wider SimpleCNN feature layer (model.feature_dim=256) and the
# paper's cosine learning-rate schedule. One process per run, one run at a time, under nice.
# Usage: experiments/spherefed/run_session3.sh NAME...   NAME = METHOD_VARIANT_SKEW_sSEED with
#   METHOD  fedavg | sphere                        (configs/paper/spherefed/fmnist_METHOD.yaml)
#   VARIANT d256 (model.feature_dim=256) | cos (train.lr_schedule=cosine, d = 84)
#   SKEW    0.1 | 0.5 | iid
# e.g. sphere_d256_0.1_s0. Runs go to $RUNS/NAME (default /work/runs/sphere3); each finished run's
# summary.json, metrics.jsonl and command.txt are copied to experiments/spherefed/results_session3/NAME/.
# Then: python experiments/spherefed/table_session3.py
set -euo pipefail
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
RUNS=${RUNS:-/work/runs/sphere3}
KEEP=experiments/spherefed/results_session3
PY=${PY:-/work/main/.venv/bin/python}
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
for name in "$@"; do
  IFS=_ read -r method variant skew seed <<< "$name"
  case $variant in
    d256) opt="model.feature_dim=256" ;;
    cos) opt="train.lr_schedule=cosine" ;;
    *) echo "unknown variant in $name" >&2; exit 2 ;;
  esac
  if [ "$skew" = iid ]; then part="partition.scheme=iid"; else part="partition.alpha=$skew"; fi
  if ended "$KEEP/$name"; then echo "$name: done"; continue; fi
  cmd=(python -m distfl train "configs/paper/spherefed/fmnist_${method}.yaml" "$part" "$opt" "seed=${seed#s}"
       "output.dir=$RUNS/$name" output.progress=log output.tensorboard=false --overwrite)
  echo ">> $(date -u +%H:%M:%S) ${cmd[*]}"
  nice -n 10 "$PY" "${cmd[@]:1}" > "$RUNS/$name.log" 2>&1
  tail -2 "$RUNS/$name.log"
  mkdir -p "$KEEP/$name"
  cp "$RUNS/$name/summary.json" "$RUNS/$name/metrics.jsonl" "$KEEP/$name/"
  echo "OMP_NUM_THREADS=1 nice -n 10 ${cmd[*]}" > "$KEEP/$name/command.txt"
done

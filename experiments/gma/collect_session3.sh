#!/usr/bin/env bash
# Copy the finished (and stopped) runs of run_session3.sh into experiments/gma/results_session3/, flattened
# as SWEEP/aggregation.mask=M_seed=S (config.yaml, metrics.jsonl, summary.json when finished); the 10-client
# sweeps, one per seed (SWEEP_s0, SWEEP_s1) or per mask and training seeds (SWEEP_none, SWEEP_t2_gma), land
# in one SWEEP folder. A run without summary.json is
# copied as partial_M_seed=S. Then: python experiments/gma/table_session2.py --session3
set -euo pipefail
cd "$(dirname "$0")/../.."
S=${RUNS:-runs/evidence}
for run in "$S"/gma300_*/aggregation.mask=*/seed=* "$S"/gma10c_*/aggregation.mask=*/seed=*; do
  [ -f "$run/metrics.jsonl" ] || continue
  sweep=$(basename "$(dirname "$(dirname "$run")")"); sweep=${sweep%_none}; sweep=${sweep%_gma}; sweep=${sweep%_s[0-9]}; sweep=${sweep%_t[0-9]*}
  mask=$(basename "$(dirname "$run")"); seed=$(basename "$run")
  name="${mask}_${seed}"; [ -f "$run/summary.json" ] || name="partial_${mask#aggregation.mask=}_${seed}"
  dest=experiments/gma/results_session3/$sweep/$name
  mkdir -p "$dest"
  cp "$run/config.yaml" "$run/metrics.jsonl" "$dest/"
  [ -f "$run/summary.json" ] && cp "$run/summary.json" "$dest/"
  echo "$run -> $dest"
done

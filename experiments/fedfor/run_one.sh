#!/usr/bin/env bash
# Run one FedFOR-study configuration and keep its metrics:
#   experiments/fedfor/run_one.sh TAG CONFIG [overrides...]
# Trains with `python -m distfl train configs/paper/fedfor/CONFIG.yaml overrides...` at nice 10 (the machine
# is shared), writes the run to runs/fedfor/TAG, and copies summary.json, metrics.jsonl, config.yaml and the
# command line to experiments/fedfor/results/TAG/.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=$1; config=$2; shift 2
py=${PYTHON:-python}  # the Python with distfl installed (e.g. PYTHON=.venv/bin/python)
out=runs/fedfor/$tag
res=experiments/fedfor/results/$tag
cmd=(nice -n 10 "$py" -m distfl train "configs/paper/fedfor/$config.yaml" "output.dir=$out" "$@")
echo "${cmd[*]}"
start=$(date +%s)
rc=0
OMP_NUM_THREADS=1 "${cmd[@]}" --overwrite > "runs/fedfor/$tag.log" 2>&1 || rc=$?
end=$(date +%s)
mkdir -p "$res"
cp "$out/summary.json" "$out/metrics.jsonl" "$out/config.yaml" "$res/" 2>/dev/null || true
cp "runs/fedfor/$tag.log" "$res/train.log"
{ echo "${cmd[*]} --overwrite"; echo "exit $rc, wall ${end}-${start} = $((end - start)) s"; } > "$res/command.txt"
echo "$tag: exit $rc, $((end - start)) s"

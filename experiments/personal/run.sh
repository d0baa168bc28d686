#!/usr/bin/env bash
# One queue of the personalised-FL comparison: every method on one split, for the given seeds.
#   experiments/personal/run.sh dir01 "0 1"     # Dir(0.1)
#   experiments/personal/run.sh c2 "0 1"        # #C=2 (NIID-Bench's n_classes draw)
# Runs land in runs/personal/<split>_<method>_s<seed>/ (summary.json, metrics.jsonl, the command in cmd.txt).
set -u
. "$(dirname "$0")/../lib.sh"  # ended DIR
split=$1; seeds=${2:-"0 1"}
case $split in
  dir01) part="partition.scheme=dirichlet partition.alpha=0.1" ;;
  c2) part="partition.scheme=n_classes partition.classes_per_client=2" ;;
  *) echo "split: dir01 | c2"; exit 2 ;;
esac
for method in fedavg fedper ditto apfl fedbabu fedrep; do
  for seed in $seeds; do
    out=runs/personal/${split}_${method}_s${seed}
    ended "$out" && continue
    cmd="python -m distfl train experiments/personal/fmnist.yaml algorithm.name=$method $part seed=$seed output.dir=$out --overwrite"
    mkdir -p "$out"; echo "$cmd" > "$out.cmd.txt"
    PYTHONPATH=. OMP_NUM_THREADS=1 ${PYTHON:-python} -m distfl train experiments/personal/fmnist.yaml \
      algorithm.name=$method $part seed=$seed output.dir=$out --overwrite > "$out.log" 2>&1
  done
done

#!/usr/bin/env bash
# pFedMe's stable setting for the all-methods protocol: short runs (20 rounds, seed 0) of the table's
# protocol with pFedMe's keys varied; results.md ("pFedMe's setting") says what each gave and which
# setting run.sh uses. The setting of the authors' README (lr 0.005, lam 15, personal lr 0.09, K 5) diverged at 100 rounds.
#   experiments/all_methods/pfedme_search.sh NAME SPLIT KEYS...   e.g.
#   experiments/all_methods/pfedme_search.sh plr003 dir01 algorithm.options.personal_lr=0.03 train.lr=0.005
# Runs land in experiments/all_methods/pfedme_search/<split>_<NAME>/ (its command in <dir>.cmd.txt).
set -u
cd "$(dirname "$0")/../.."
name=$1; split=$2; shift 2
case $split in
  dir01) part="partition.scheme=dirichlet partition.alpha=0.1" ;;
  c2) part="partition.scheme=n_classes partition.classes_per_client=2" ;;
  *) echo "split: dir01 | c2"; exit 2 ;;
esac
out=experiments/all_methods/pfedme_search/${split}_${name}
mkdir -p "$(dirname "$out")"
# shellcheck disable=SC2086
cmd="python -m distfl train experiments/personal/fmnist.yaml train.rounds=20 eval.every=10 algorithm.name=pfedme $* $part seed=0 output.dir=$out"
echo "$cmd" > "$out.cmd.txt"
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 ${PYTHON:-python} -m distfl train experiments/personal/fmnist.yaml train.rounds=20 eval.every=10 \
  algorithm.name=pfedme "$@" $part seed=0 output.dir=$out --overwrite > "$out.log" 2>&1 || echo "FAILED $out (see $out.log)"
rm -rf "$out/checkpoints"

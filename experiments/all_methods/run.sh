#!/usr/bin/env bash
# Every method of distfl side by side on one protocol (issue 21): experiments/personal/fmnist.yaml with
# 100 rounds (real Fashion-MNIST, 100 clients, 10 a round, SimpleCNN, 1 local epoch of plain SGD, lr 0.05,
# batch 32, eval.clients every 10 rounds), two label-skew splits, each method at its defaults.
#   experiments/all_methods/run.sh dir01 "0 1"     # Dir(0.1)
#   experiments/all_methods/run.sh c2 "0 1"        # #C=2 (NIID-Bench's n_classes draw)
#   python experiments/all_methods/table.py        # the table (experiments/all_methods/results.md)
# Runs land in experiments/all_methods/runs/<split>_<method>_s<seed>/ (summary.json, metrics.jsonl,
# config.yaml; the command in <dir>.cmd.txt). A finished run is skipped; METHODS="a b" picks some.
# ccvr and ffc calibrate one FedAvg training (<split>_calibrated_fedavg_s<seed>, its checkpoint kept until
# both are done): each a copy of it given to `distfl calibrate --method ccvr|ffc`.
set -u
. "$(dirname "$0")/../lib.sh"  # ended DIR
cd "$(dirname "$0")/../.."
split=$1; seeds=${2:-"0 1"}
case $split in
  dir01) part="partition.scheme=dirichlet partition.alpha=0.1" ;;
  c2) part="partition.scheme=n_classes partition.classes_per_client=2" ;;
  *) echo "split: dir01 | c2"; exit 2 ;;
esac
# The method's keys on top of the protocol. Choices (results.md says why): FedProx mu 0.01 (NIID-Bench's
# default); GMA tau 0.4 (its FMNIST value); SphereFed at lr 0.2 (its MSE loss needs a larger step:
# configs/paper/spherefed/fmnist_sphere.yaml) with FFC; MOON on the network with its 256-d projection head;
# TCT: 20 rounds of FedAvg, then stage 2 at the reduced p = 4,096 of experiments/tct; pFedMe at personal lr
# 0.03 and the protocol's lr 0.05 as eta (the paper's 0.09 and 0.005 diverged: results.md, "pFedMe's
# setting"; experiments/all_methods/pfedme_search.sh); FedAvg + CCVR and
# FedAvg + FFC at their defaults (CCVR: 100 virtual features a class, 10 passes; FFC: lambda 0).
# fedavg_e11: FedAvg at 11 local epochs, FedRep's gradient steps a round (the compute-matched row; not in ORDER:
# METHODS=fedavg_e11 runs it).
declare -A KEYS=(
  [fedavg]="algorithm.name=fedavg"
  [fedavg_ft]="algorithm.name=fedavg eval.finetune_epochs=5"
  [fedavg_e11]="algorithm.name=fedavg train.local_epochs=11"
  [fedprox]="algorithm.name=fedprox algorithm.mu=0.01"
  [scaffold]="algorithm.name=scaffold"
  [feddyn]="algorithm.name=feddyn"
  [fednova]="algorithm.name=fednova"
  [fedadc]="algorithm.name=fedadc"
  [slowmo]="algorithm.name=slowmo"
  [fedfor]="algorithm.name=fedfor"
  [gma]="algorithm.name=fedavg aggregation.mask=gma aggregation.tau=0.4"
  [spherefed]="algorithm.name=fedavg model.head=sphere calibration.method=ffc train.lr=0.2"
  [tct]="algorithm.name=tct tct.p=4096 tct.compute_dtype=float32"
  [moon]="algorithm.name=moon model.projection_dim=256"
  [fedexp]="algorithm.name=fedexp"
  [fedper]="algorithm.name=fedper"
  [fedrep]="algorithm.name=fedrep"
  [fedbabu]="algorithm.name=fedbabu"
  [ditto]="algorithm.name=ditto"
  [apfl]="algorithm.name=apfl"
  [local]="algorithm.name=local"
  [lgfedavg]="algorithm.name=lgfedavg"
  [fedlc]="algorithm.name=fedlc"
  [fedntd]="algorithm.name=fedntd"
  [perfedavg]="algorithm.name=perfedavg"
  [pfedme]="algorithm.name=pfedme algorithm.options.personal_lr=0.03"
  [fedrod]="algorithm.name=fedrod"
  [fedproto]="algorithm.name=fedproto"
  [fedala]="algorithm.name=fedala"
  [fedpac]="algorithm.name=fedpac"
)
ORDER="fedavg fedprox scaffold feddyn fednova fedadc slowmo fedfor gma spherefed moon fedexp tct fedper fedrep fedbabu ditto apfl fedavg_ft local lgfedavg fedlc fedntd ccvr ffc perfedavg pfedme fedrod fedproto fedala fedpac"
OUT=experiments/all_methods/runs
PROTOCOL="train.rounds=100 eval.every=10"
PY=${PYTHON:-python}
calibrated() {  # FedAvg + CCVR or FFC: distfl calibrate on a copy of one FedAvg training per split and seed
  local method=$1 seed=$2 out=$3 base=$OUT/${split}_calibrated_fedavg_s$2
  mkdir -p "$OUT"
  if ! ended "$base"; then
    # shellcheck disable=SC2086
    echo "python -m distfl train experiments/personal/fmnist.yaml $PROTOCOL algorithm.name=fedavg $part seed=$seed output.dir=$base" > "$base.cmd.txt"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 $PY -m distfl train experiments/personal/fmnist.yaml $PROTOCOL algorithm.name=fedavg $part \
      seed="$seed" output.dir="$base" --overwrite > "$base.log" 2>&1 || { echo "FAILED $base (see $base.log)"; return; }
  fi
  rm -rf "$out"; cp -r "$base" "$out"
  echo "cp -r $base $out; python -m distfl calibrate $out --method $method" > "$out.cmd.txt"
  OMP_NUM_THREADS=1 $PY -m distfl calibrate "$out" --method "$method" > "$out.log" 2>&1 || echo "FAILED $out (see $out.log)"
  rm -rf "$out/checkpoints"
  ended "$OUT/${split}_ccvr_s$seed" && ended "$OUT/${split}_ffc_s$seed" && rm -rf "$base/checkpoints"
}
for method in ${METHODS:-$ORDER}; do
  for seed in $seeds; do
    out=$OUT/${split}_${method}_s${seed}
    ended "$out" && continue
    if [ "$method" = ccvr ] || [ "$method" = ffc ]; then
      echo ">> $method on $OUT/${split}_calibrated_fedavg_s$seed"; calibrated "$method" "$seed" "$out"; continue
    fi
    # shellcheck disable=SC2086
    cmd="python -m distfl train experiments/personal/fmnist.yaml $PROTOCOL ${KEYS[$method]} $part seed=$seed output.dir=$out"
    mkdir -p "$OUT"; echo "$cmd" > "$out.cmd.txt"
    echo ">> $cmd"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 ${PYTHON:-python} -m distfl train experiments/personal/fmnist.yaml $PROTOCOL ${KEYS[$method]} $part \
      seed=$seed output.dir=$out --overwrite > "$out.log" 2>&1 || echo "FAILED $out (see $out.log)"
    rm -rf "$out/checkpoints"
  done
done

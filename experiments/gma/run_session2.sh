#!/usr/bin/env bash
# Session "Paper evidence II": GMA with client momentum 0.9 on 100 clients (10 a round), #C=2, LeNet-5.
# Local-lr probe, then AVG vs GMA at local lr 0.02 with server lr 1 and 2, seeds 0 and 1, 30 rounds.
# Runs resume (distfl sweep); copy the finished points to experiments/gma/results_session2/ and run
# python experiments/gma/table_session2.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python}
S=${RUNS:-runs/evidence}
export OMP_NUM_THREADS=1
nice -n 5 "$py" -m distfl sweep configs/paper/gma/fmnist_label_skew.yaml output.dir=$S/gma_probe100 \
  train.momentum=0.9 aggregation.mask=none train.rounds=10 eval.every=2 checkpoint.every=0 output.tensorboard=false \
  --grid train.lr=0.01,0.02,0.05 --seeds 0
nice -n 5 "$py" -m distfl sweep configs/paper/gma/fmnist_label_skew.yaml output.dir=$S/gma_m09_slr1.0 \
  train.momentum=0.9 train.lr=0.05 server.lr=1.0 train.rounds=30 eval.every=2 checkpoint.every=10 \
  output.tensorboard=false --grid aggregation.mask=none --seeds 0
for slr in 1.0 2.0; do
  nice -n 5 "$py" -m distfl sweep configs/paper/gma/fmnist_label_skew.yaml output.dir=$S/gma_m09_lr0.02_slr$slr \
    train.momentum=0.9 train.lr=0.02 server.lr=$slr train.rounds=30 eval.every=2 checkpoint.every=10 \
    output.tensorboard=false --grid aggregation.mask=none,gma --seeds 0,1
done

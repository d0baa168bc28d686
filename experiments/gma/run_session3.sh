#!/usr/bin/env bash
# Session "Paper evidence II", part 3: AVG vs GMA trained far longer (300 rounds) than part 2 (30 rounds).
# Table 2's FedAvg row, 100 clients, 10 a round, #C=2 (NIID-Bench draw), LeNet-5, client momentum 0.9,
# local lr 0.02 (the lr at which momentum 0.9 trains here, experiments/gma/results.md), batch 32,
# 1 local epoch, tau 0.4; server lr 1 then 1.5 (the paper tunes over {1, 1.5, 2}); seeds 0 and 1.
# Runs resume (distfl sweep): rerun the script after a stop. Copy finished points to
# experiments/gma/results_session3/ and run python experiments/gma/table_session2.py --session3.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-python}
S=${RUNS:-runs/evidence}
export OMP_NUM_THREADS=1
for slr in 1.0 1.5; do
  nice -n ${NICE:-5} "$py" -m distfl sweep configs/paper/gma/fmnist_label_skew.yaml output.dir=$S/gma300_m09_lr0.02_slr$slr \
    train.momentum=0.9 train.lr=0.02 server.lr=$slr train.rounds=300 eval.every=2 checkpoint.every=50 \
    output.tensorboard=false --seeds 0,1 --grid aggregation.mask=none,gma
done

#!/bin/bash
# The LoRA recipe of docs/foundation.md and the evidence rows of docs/evidence.md (F1-F3), end to end, from
# the repository root:
#   [JOBS=2] experiments/foundation/run.sh [SEED ...]        (default seeds: 0 1)
# 1. writes the two Fashion-MNIST tasks (make_tasks.py) and the two standard-library federations (distfl data
#    prepare python) under data/foundation, if absent;
# 2. pretrains SimpleCNN on classes 0-4 (pretrain.yaml), then token_transformer on eight packages
#    (text_pretrain.yaml) beside the image runs that follow, seed 0;
# 3. adapts each, for every SEED, on adapt.yaml (classes 5-9, 50 clients, Dirichlet(0.5)):
#      fedit_r8, ffa_r8          LoRA rank 8 (alpha 16), FedIT / FFA-LoRA aggregation
#      stack_r8                  the same with FLoRA's stacking (model.lora.aggregate=stack)
#      fedit_r8_dp, ffa_r8_dp    the same under central DP (privacy.mechanism=gaussian, z = 0.2, C = 1, uniform weights)
#      fedit_r4, fedit_r16       FedIT at rank 4 and 16 (alpha = 2 r: the same scaling 2)
#      full                      full fine-tuning (every parameter trained and sent)
#      ffa_r8_aA, fedit_r8_aA    the scaling alpha = A (32, 64) instead of 16, for FFA-LoRA (with and without
#      (and _dp)                 DP) and FedIT (32 with and without DP, 64): rows R1, R2 over alpha
#    and, seed 0 only, text_adapt.yaml (fifteen other packages): text_lora (FedIT, rank 8), text_full, and
#    text_base: the pretrained model scored on them before any adaptation (one round at server lr 1e-30, which
#    leaves the frozen base bit for bit as loaded and adds a B A of order 1e-30 that vanishes in float32).
# JOBS runs at a time (default 2), each with one thread at nice 10; a run that ended is skipped.
# Then: python experiments/foundation/table.py > experiments/foundation/results.md
set -e
. "$(dirname "$0")/../lib.sh"  # ended DIR
seeds=${*:-0 1}
here=experiments/foundation
out=$here/runs
stdlib=$(python -c "import sysconfig; print(sysconfig.get_paths()['stdlib'])")
mkdir -p "$out" data/foundation
export OMP_NUM_THREADS=1
[ -f data/foundation/fmnist_5to9.npz ] || python $here/make_tasks.py --out data/foundation
[ -d data/foundation/stdlib_pretrain ] || python -m distfl data prepare python --from "$stdlib" --sequence-length 64 \
  --packages asyncio,email,http,logging,multiprocessing,unittest,urllib,xml --out data/foundation/stdlib_pretrain
[ -d data/foundation/stdlib_adapt ] || python -m distfl data prepare python --from "$stdlib" --sequence-length 64 \
  --packages collections,concurrent,ctypes,curses,dbm,html,importlib,json,re,sqlite3,tomllib,venv,wsgiref,xmlrpc,zoneinfo \
  --out data/foundation/stdlib_adapt
DP="algorithm.weighting=uniform privacy.mechanism=gaussian privacy.noise_multiplier=0.2 privacy.clip_norm=1.0 privacy.delta=0.01 privacy.secure_noise=false"
keys() {  # name -> config and overrides of that run
  case $1 in
    pretrain) echo "$here/pretrain.yaml" ;;
    text_pretrain) echo "$here/text_pretrain.yaml" ;;
    fedit_r8) echo "$here/adapt.yaml" ;;
    ffa_r8) echo "$here/adapt.yaml model.lora.aggregate=ffa" ;;
    stack_r8) echo "$here/adapt.yaml model.lora.aggregate=stack" ;;
    fedit_r8_dp) echo "$here/adapt.yaml $DP" ;;
    ffa_r8_dp) echo "$here/adapt.yaml model.lora.aggregate=ffa $DP" ;;
    fedit_r4) echo "$here/adapt.yaml model.lora.rank=4 model.lora.alpha=8" ;;
    fedit_r16) echo "$here/adapt.yaml model.lora.rank=16 model.lora.alpha=32" ;;
    full) echo "$here/adapt.yaml model.lora.rank=0" ;;
    ffa_r8_a32|ffa_r8_a64) echo "$here/adapt.yaml model.lora.aggregate=ffa model.lora.alpha=${1#ffa_r8_a}" ;;
    ffa_r8_a32_dp|ffa_r8_a64_dp) a=${1#ffa_r8_a}; echo "$here/adapt.yaml model.lora.aggregate=ffa model.lora.alpha=${a%_dp} $DP" ;;
    fedit_r8_a32|fedit_r8_a64) echo "$here/adapt.yaml model.lora.alpha=${1#fedit_r8_a}" ;;
    fedit_r8_a32_dp) echo "$here/adapt.yaml model.lora.alpha=32 $DP" ;;
    text_lora) echo "$here/text_adapt.yaml" ;;
    text_full) echo "$here/text_adapt.yaml model.lora.rank=0" ;;
    text_base) echo "$here/text_adapt.yaml train.rounds=1 eval.every=1 server.optimizer=sgd server.lr=1e-30" ;;
  esac
}
run() {  # name seed
  local dir="$out/$1_s$2"
  ended "$dir" && return
  local cmd="python -m distfl train $(keys "$1") seed=$2 output.dir=$dir"
  echo "$cmd" > "$dir.cmd"
  nice -n 10 $cmd --overwrite > "$dir.log" 2>&1
}
queue() {  # "name seed" ...
  for item in "$@"; do
    while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-2}" ]; do wait -n || true; done
    run $item &
  done
  wait
}
queue "pretrain 0"
items=("text_pretrain 0")
for seed in $seeds; do
  for name in fedit_r8 ffa_r8 stack_r8 fedit_r8_dp ffa_r8_dp fedit_r4 fedit_r16 full \
              ffa_r8_a32 ffa_r8_a64 ffa_r8_a32_dp ffa_r8_a64_dp fedit_r8_a32 fedit_r8_a64 fedit_r8_a32_dp; do
    items+=("$name $seed")
  done
done
queue "${items[@]}"
queue "text_base 0" "text_lora 0" "text_full 0"

#!/usr/bin/env bash
# #C=1 with the paper's whole schedule (configs/paper/tct/fmnist.yaml as it stands: 100 stage-1 rounds of
# 5 local epochs, p = all 44,426 coordinates, 100 stage-2 rounds, M = 500, eta = 5e-5). Only the storage
# differs: float16 features and float32 stage-2 products, to fit beside other work on this machine.
# Extra arguments are overrides. This session stopped the run after stage-1 round 25 (SIGTERM: an agreed
# checkpoint) and resumed it with `tct.p=4096 tct.feature_dtype=float32`: with all 44,426 coordinates a
# stage-2 round took 24 s on this machine (40 min for 100 rounds), too long for the session. So this is
# the paper's stage 1 followed by the same stage 2 as experiments/tct/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=experiments/tct/results/C1_paper
if [ -f "$dir/checkpoints/latest" ]; then
  cmd=(torchrun --standalone --nproc_per_node=2 -m distfl train --resume "$dir" "$@")
else
  cmd=(torchrun --standalone --nproc_per_node=2 -m distfl train configs/paper/tct/fmnist.yaml
       partition.scheme=n_classes partition.classes_per_client=1 tct.feature_dtype=float16
       tct.compute_dtype=float32 "output.dir=$dir" output.progress=log output.tensorboard=false "$@")
fi
echo "${cmd[*]}" >> "$dir.command.txt"
OMP_NUM_THREADS=1 nice "${cmd[@]}" >> "$dir.log" 2>&1
tail -2 "$dir.log"

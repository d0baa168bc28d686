#!/usr/bin/env bash
# Try the multi-node code path on one machine: two torchrun agents act as two nodes (NPROC ranks
# each) and meet through a c10d rendezvous on 127.0.0.1, as slurm/train.sbatch starts them on a
# cluster. tests/integration/test_multinode.py checks that this trains the same model as one node.
#
#   launch/two_nodes_localhost.sh CONFIG [key=value ...]        (NPROC=1, PORT=29517 by default)
set -euo pipefail
CONFIG=${1:?usage: launch/two_nodes_localhost.sh CONFIG [key=value ...]}
shift
PYTHON=${PYTHON:-python}
NPROC=${NPROC:-1}
PORT=${PORT:-29517}
pids=()
for node in 0 1; do
  "$PYTHON" -m torch.distributed.run --nnodes=2 --node_rank=$node --nproc_per_node="$NPROC" \
    --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$PORT" --rdzv_id="distfl-local-$PORT" \
    -m distfl train "$CONFIG" "$@" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit "$status"

#!/bin/bash
# NIID-Bench runs on one GPU, JOBS of them at once (each its own process; a run alone leaves the GPU
# mostly idle between kernel launches). Each job is PART:RUN:SEED, run by run.sh with the GPU settings:
# runtime.device=cuda, the round's 10 clients trained as one pack (runtime.pack_size=10; SCAFFOLD packs
# with its client state on disk). Runs still going DEADLINE seconds after the start are stopped; being
# sweeps, they resume from their last round when started again with the same arguments.
# Usage: JOBS=8 DEADLINE=3600 experiments/niid_bench/run_gpu.sh OUT C3:fedprox:0 iid:fedavg:1 ...
# Each job's output: OUT/log_PART_RUN_SEED.txt. Used by bench/gpu_niid_session.sh.
set -u
cd "$(dirname "$0")/../.."
export OUT=$1; shift
mkdir -p "$OUT"
export END=$(( $(date +%s) + ${DEADLINE:-86400} ))
export EXTRA=${EXTRA:-"runtime.device=cuda runtime.pack_size=10 runtime.client_state=disk runtime.placement=auto"}
export OMP_NUM_THREADS=1 PYTHON=${PYTHON:-python3}
printf '%s\n' "$@" | xargs -P "${JOBS:-4}" -I{} bash -c '
  IFS=: read -r part run seed <<< "{}"
  left=$(( END - $(date +%s) ))
  [ "$left" -gt 30 ] || { echo "not started (deadline): {}"; exit 0; }
  PARTS=$part RUNS=$run SEEDS=$seed timeout -k 60 "$left" experiments/niid_bench/run.sh "$OUT" \
    > "$OUT/log_${part}_${run}_${seed}.txt" 2>&1
  echo "$(date +%T) {}: $(grep -h "final test accuracy" "$OUT/log_${part}_${run}_${seed}.txt" || echo stopped or failed)"'
# A stopped job's shell ends at once, its sweep only after its current round's checkpoint: wait for them.
while ps -eo args | grep -v grep | grep -q "distfl sweep .*output.dir=$OUT/"; do sleep 2; done

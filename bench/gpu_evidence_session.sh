#!/bin/bash
# On a GPU machine, from the repo root, after bench/gpu_prepare.sh here (carry .whl and .gpu): the GPU
# checks the first GPU session (bench/gpu_session.sh) left, and NIID-Bench runs, in one call of about
# 9 minutes. Results go to $OUT (default ./gpu_out):
#   tct-cuda.json      the TCT features bench with the features on the GPU (evidence T6), run alone;
#   test_cuda.txt      tests/integration/test_cuda.py (packs auto = 50 on CUDA, after the FFC one-hot fix);
#   niid_gpu.tgz       NIID-Bench runs (experiments/niid_bench/run_gpu.sh), each stopped at NIID_DEADLINE
#                      seconds if not finished (checkpoints included: they resume), logs included.
# NIID_JOBS (default 8) runs at once; the jobs are the arguments (PART:RUN:SEED).
set -u
source bench/gpu_setup.sh
export PYTHONPATH=$PWD
step "TCT features bench on the GPU (alone)"
timeout 150 python3 -m distfl bench --suite tct --device cuda --repeats 3 --out "$OUT/tct-cuda.json" > "$OUT/tct.log" 2>&1
tail -16 "$OUT/tct.log"
step "tests/integration/test_cuda.py, beside the NIID-Bench runs"
timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 2 -rs tests/integration/test_cuda.py > "$OUT/test_cuda.txt" 2>&1 &
DEADLINE=${NIID_DEADLINE:-360} JOBS=${NIID_JOBS:-8} experiments/niid_bench/run_gpu.sh /tmp/niid "$@"
wait
tail -8 "$OUT/test_cuda.txt"
step "packing the NIID-Bench runs"
tar czf "$OUT/niid_gpu.tgz" -C /tmp/niid .
ls -la "$OUT"
step done

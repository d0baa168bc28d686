#!/bin/bash
# On a GPU machine, from the repo root, after bench/gpu_prepare.sh here (carry .whl and .gpu): every GPU
# check of docs/gpu.md in one call of about 5-6 minutes on an H200 (the TCT step not yet timed there). Results go to $OUT (default ./gpu_out).
#   the step probe (bench/cuda_step.py), the cross-device bench with pfl-research beside it, the TCT features bench,
#   tests/test_cuda.py, and the quickstart on CUDA: pack_size=1 on 2 ranks, auto on 2 ranks and on 1.
set -u
source bench/gpu_setup.sh
step "step probe"
PYTHONPATH=. timeout 100 python3 bench/cuda_step.py > "$OUT/cuda_step.txt" 2>&1; tail -9 "$OUT/cuda_step.txt" | head -8
step "cross-device bench"
DISTFL_PFL_PYTHON=python3 timeout 240 python3 -m distfl bench --suite cross-device --device cuda --rounds 3 --repeats 3 \
  --pack-sizes 1,10,25,50 --out "$OUT/cross-device-cuda.json" > /tmp/bench.log 2>&1; tail -14 /tmp/bench.log
step "TCT features bench (evidence T6)"
timeout 180 python3 -m distfl bench --suite tct --device cuda --repeats 1 --out "$OUT/tct-cuda.json" > /tmp/tct.log 2>&1; tail -12 /tmp/tct.log
step "tests/test_cuda.py and the quickstart"
timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 3 -rs tests/test_cuda.py > "$OUT/test_cuda.txt" 2>&1 &
QS="configs/quickstart.yaml runtime.device=cuda"
for run in "2 runtime.pack_size=1 pack1_2ranks" "2 runtime.pack_size=0 auto_2ranks" "1 runtime.pack_size=0 auto_1rank"; do
  set -- $run
  timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=$1 -m distfl train $QS $2 output.dir=/tmp/qs_$3
done > /tmp/quickstart.txt 2>&1; grep -h "final test" /tmp/quickstart.txt
wait
tail -6 "$OUT/test_cuda.txt"
python3 - "$OUT" <<'PY'
import json, sys
rows = {}
for name in ("pack1_2ranks", "auto_2ranks", "auto_1rank"):
    try:
        s = json.load(open(f"/tmp/qs_{name}/summary.json"))
        rows[name] = {k: s.get(k) for k in ("model_sha256", "final_test_acc", "world_size", "pack_size", "wall_s")}
    except OSError as e:
        rows[name] = repr(e)
print(json.dumps(rows, indent=1))
json.dump(rows, open(f"{sys.argv[1]}/quickstart.json", "w"), indent=1)
PY
step done

#!/usr/bin/env bash
# #C=1 stage 2 again from the same stage-1 model (experiments/tct/results/C1, round 10), with eta scaled
# by P/p = 44426/4096 (5.4e-4 instead of 5e-5): with p of the P coordinates, the normalised kernel's
# eigenvalues are about p/P of the full one's, so the same eta covers about p/P of the paper's
# "time" M*eta*lambda. This copies C1's run directory up to its last training checkpoint and resumes
# it with the new tct.lr (tct.* may change until stage 2 starts).
set -euo pipefail
cd "$(dirname "$0")/../.."
src=experiments/tct/results/C1 dst=experiments/tct/results/C1_lr5.4e-4
if [ -f "$dst/summary.json" ]; then echo "$dst: done"; exit 0; fi
rm -rf "$dst" && mkdir -p "$dst/checkpoints"
cp "$src/config.yaml" "$dst/" && cp "$src/metrics.jsonl" "$dst/"
if [ -d "$src/checkpoints/round_000010" ]; then
  cp -r "$src/checkpoints/round_000010" "$dst/checkpoints/" && echo round_000010 > "$dst/checkpoints/latest"
else
  # C1 ran before distfl kept the last training checkpoint of runs with phases: rebuild it from a stage-2
  # checkpoint, whose global model is still the stage-1 model, with the stage-2 progress taken out.
  python - "$src" "$dst" <<'PY'
import sys
from pathlib import Path
import torch
from distfl import checkpoint
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
state = checkpoint.load(checkpoint.complete_checkpoints(src)[0], "cpu")
state.update(round=10, step=10, phases_done=[], phase_results={}, phase_state={})
state.pop("format_version")
checkpoint.begin(dst, "round_000010")
checkpoint.commit(dst, "round_000010", state, keep=1)
PY
fi
python - "$dst" <<'PY'
import json, sys
from pathlib import Path
path = Path(sys.argv[1]) / "metrics.jsonl"
rows = [line for line in path.read_text().splitlines() if json.loads(line)["round"] <= 10]
path.write_text("\n".join(rows) + "\n")
PY
cmd=(torchrun --standalone --nproc_per_node=2 -m distfl train --resume "$dst" tct.lr=5.4e-4)
echo "${cmd[*]}" > "$dst.command.txt"
OMP_NUM_THREADS=1 nice "${cmd[@]}" > "$dst.log" 2>&1
tail -2 "$dst.log"

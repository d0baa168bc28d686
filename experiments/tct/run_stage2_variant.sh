#!/usr/bin/env bash
# Stage 2 again from the #C=1 stage-1 model (experiments/tct/results/C1, round 10) with other tct.*
# settings: copies C1's run directory up to its last training checkpoint and resumes the copy with the
# given overrides (tct.* may change until stage 2 starts).
# Usage: experiments/tct/run_stage2_variant.sh NAME tct.key=value ...
set -euo pipefail
cd "$(dirname "$0")/../.."
name=$1; shift
src=experiments/tct/results/C1 dst=experiments/tct/results/$name
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
cmd=(torchrun --standalone --nproc_per_node=2 -m distfl train --resume "$dst" "$@")
echo "${cmd[*]}" > "$dst.command.txt"
OMP_NUM_THREADS=1 nice "${cmd[@]}" > "$dst.log" 2>&1
tail -2 "$dst.log"

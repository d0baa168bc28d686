#!/usr/bin/env bash
# CCVR's settings on one trained model: a copy of RUN (a run of experiments/ccvr/run.sh, with its
# checkpoints), cut back to its last training round, resumed with other calibration.* values.
#   experiments/ccvr/variants.sh RUN NAME key=value ...    # writes RUN_NAME next to RUN
set -euo pipefail
cd "$(dirname "$0")/../.."
src=$1; name=$2; shift 2
dst=experiments/ccvr/results/$(basename "${src%/}")_$name
rm -rf "$dst"; cp -r "$src" "$dst"; rm -rf "$dst"/checkpoints/ccvr_* "$dst"/checkpoints/ffc_*
ls "$dst/checkpoints" | grep '^round_' | sort | tail -1 > "$dst/checkpoints/latest"
echo "experiments/ccvr/variants.sh $src $name $*" > "$dst.command.txt"
OMP_NUM_THREADS=1 nice "${PYTHON:-python}" -m distfl train --resume "$dst" calibration.method=ccvr "$@" > "$dst.log" 2>&1
rm -rf "$dst/checkpoints"
tail -2 "$dst.log"

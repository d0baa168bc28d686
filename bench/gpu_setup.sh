#!/bin/bash
# Sourced by the GPU session scripts, on a bare GPU machine, from the repo root: installs the wheels and
# Fashion-MNIST that bench/gpu_prepare.sh gathered here (carry .whl and .gpu), sets OUT (default
# ./gpu_out) and defines `step` (prints a heading with the seconds since the start).
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
OUT=${OUT:-gpu_out}; mkdir -p "$OUT"
T0=$(date +%s); step(){ echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl
D=${FMNIST_DIR:-/usr/share/datasets/fashion-mnist}; mkdir -p $D; cp .gpu/fmnist/*.gz $D/
python3 -c "import lzma, shutil; shutil.copyfileobj(lzma.open('.gpu/fmnist/train-images-idx3-ubyte.xz'), open('$D/train-images-idx3-ubyte', 'wb'))"
nvidia-smi -L

#!/bin/bash
# Here (no GPU): gather what bench/gpu_session.sh needs on a bare GPU machine that has python3 with torch
# but no network: distfl's other dependencies and pfl-research 0.6 as wheels for its Python (.whl/), and
# Fashion-MNIST (.gpu/fmnist/, the training images xz-compressed to fit a 64 MiB transfer). Both folders are
# git-ignored (.gitignore). Usage: bench/gpu_prepare.sh [PYTHON_VERSION, default 3.12]
set -eu
cd "$(dirname "$0")/.."
PYV=${1:-3.12}
mkdir -p .whl .gpu/fmnist
PLAT="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
for pkg in pfl==0.6.0 prv-accountant==0.2.0 multiprocess==0.70.19 dill==0.4.1 dp-accounting==0.6.0 dm-tree==0.1.10 submitit; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp $PLAT -d .whl "$pkg"
done
SRC=/usr/share/datasets/fashion-mnist  # `make data`
cp $SRC/t10k-images-idx3-ubyte.gz $SRC/t10k-labels-idx1-ubyte.gz $SRC/train-labels-idx1-ubyte.gz .gpu/fmnist/
zcat $SRC/train-images-idx3-ubyte.gz | xz -9e > .gpu/fmnist/train-images-idx3-ubyte.xz
du -sh .whl .gpu
# What travels to the GPU machine (tracked and untracked-not-ignored files, plus the two carried folders)
# must stay under 64 MiB. The committed NIID-Bench runs (~30 MiB) are what to leave behind if it does not:
# echo /experiments/niid_bench/runs/ >> "$(git rev-parse --git-path info/exclude)"; git rm -r -q --cached experiments/niid_bench/runs
# and, after the call: git reset -q HEAD -- experiments/niid_bench/runs; then delete that exclude line.
MIB=$(git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | awk '/total$/ {s += $1} END {print int(s / 1048576)}')
CARRY=$(du -sm .whl .gpu | awk '{s += $1} END {print s}')
echo "working tree ${MIB} MiB + .whl and .gpu ${CARRY} MiB (limit 64 MiB)"
if [ $((MIB + CARRY)) -gt 64 ]; then
  echo "OVER 64 MiB: leave the NIID-Bench runs behind for the call. Before it:"
  echo "  echo /experiments/niid_bench/runs/ >> \"\$(git rev-parse --git-path info/exclude)\"; git rm -r -q --cached experiments/niid_bench/runs"
  echo "after it: git reset -q HEAD -- experiments/niid_bench/runs, then delete that line from the exclude file"
fi

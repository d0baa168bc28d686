#!/usr/bin/env bash
# #C=1 stage 2 with eta scaled by P/p = 44426/4096 (5.4e-4 instead of 5e-5): with p of the P coordinates,
# the normalised kernel's eigenvalues are about p/P of the full one's, so the same eta covers about p/P
# of the paper's "time" M*eta*lambda. Then the paper's p (all 44,426 coordinates, float16 features).
set -euo pipefail
cd "$(dirname "$0")"
./run_stage2_variant.sh C1_lr5.4e-4 tct.lr=5.4e-4
./run_stage2_variant.sh C1_pall tct.p=100000 tct.feature_dtype=float16

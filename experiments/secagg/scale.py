"""The grid resolution for DDGauss at `bits` bits (experiments/secagg/run.sh): the largest secagg.scale_bits
whose calibrated sum fits the modular range with k = 4 standard deviations to spare, as Kairouz, Liu & Steinke
(ICML 2021, Section 5) choose gamma = 2^-scale_bits: with n clients, d' padded values, clip c, scale s and each
client's noise stddev sigma (model units), 2^(bits-1) >= k sqrt((n c s)^2 / d' + n (1/4 + (sigma s)^2)) in grid
units (the clients' updates aligned, their rounding and noise independent). Where none fits (few bits: a coarse
grid inflates the rounding's sensitivity, so the calibrated noise grows as fast as the grid coarsens and the
room levels off), k is lowered to 0.9 of the most room any scale_bits gives. Prints it; trains nothing.

    python experiments/secagg/scale.py BITS [KEY=VALUE ...]   (the run's overrides of fmnist.yaml)
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from distfl.config import load_config
from distfl.secagg.aggregator import distributed_dp

HERE = Path(__file__).resolve().parent
DIM = 8192  # mclr on 28x28 inputs: 7,850 values, padded to a power of two
K = 4


def stddevs(cfg, dim: int = DIM) -> float:
    """How many standard deviations of a coordinate of the sum fit in half the modular range."""
    dp, n = distributed_dp(cfg, dim), cfg.train.clients_per_round
    std = math.sqrt((n * dp.l2_clip * dp.scale) ** 2 / dim + n * (0.25 + (dp.local_sigma * dp.scale) ** 2))
    return 2 ** (cfg.secagg.bits - 1) / std


def scale_bits(bits: int, overrides: list[str]) -> int:
    room = {}
    for candidate in range(bits, -1, -1):
        cfg = load_config(str(HERE / "fmnist.yaml"), [*overrides, f"secagg.bits={bits}", f"secagg.scale_bits={candidate}"])
        room[candidate] = stddevs(cfg)
        if room[candidate] >= K:
            return candidate
    k = 0.9 * max(room.values())
    return max(candidate for candidate, r in room.items() if r >= k)


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    print(scale_bits(int(sys.argv[1]), sys.argv[2:]))

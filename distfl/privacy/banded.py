"""DP-FTRL's noise by banded matrix factorisation (Choquette-Choo, Ganesh, McKenna, McMahan, Rush,
Thakurta and Xu, "(Amplified) Banded Matrix Factorization: A unified approach to private training",
NeurIPS 2023, Sec. 3-4), for cyclic participation (train.cohort=sequential).

The rounds' clipped sums x (n rounds) are wanted as prefix sums A x, A the lower-triangular matrix of ones.
Factor A = B C with C lower triangular, Toeplitz and b-banded (C[t, s] = c_{t-s} for 0 <= t - s < b, else
0), ||c|| = 1. The mechanism releases C x + sigma Z, Z standard normal, and post-processes it into
B (C x + sigma Z) = A x + sigma A C^-1 Z: the prefix sums with correlated noise. As for tree aggregation,
a round releases the difference of consecutive prefix sums, x_t + sigma (C^-1 Z)_t.

Sensitivity (their Thm. 2): column s of a b-banded C is non-zero in rows s .. s + b - 1 only, so the
columns of rounds at least b apart are orthogonal. A client in at most k rounds, any two at least b apart
(sequential cohorts: b <= floor(N / m)), moves C x by at most C_clip sqrt(k) max_s ||C[:, s]|| =
C_clip sqrt(k): the whole release is ONE Gaussian mechanism of multiplier z / sqrt(k) (accountant.py),
k = ceil(rounds / floor(N / m)).

c is the optimal banded Toeplitz factor: it minimises the total squared error of the prefix sums,
||A C^-1||_F^2 (their objective for the prefix-sum workload), over unit-norm b-banded Toeplitz c only (the
paper optimises every entry of a banded C, which can do better: docs/privacy.md), by L-BFGS from the truncated coefficients of
A^(1/2) (c_i = binom(2i, i) / 4^i, the optimal Toeplitz square root). With u the first column of C^-1
(also Toeplitz) and U_s = u_0 + ... + u_s, (A C^-1)[t, s] = U_{t-s}, so the objective is
sum_s (n - s) U_s^2, O(n b) to evaluate.

Noise: w = C^-1 Z by forward substitution, w_t = (Z_t - c_1 w_{t-1} - ... - c_{b-1} w_{t-b+1}) / c_0, Z_t
drawn from (key, t) on every rank: one draw and b - 1 multiply-adds a round, the last b - 1 w kept in
memory. A resumed run recomputes them from round 1 with the same operations, so it continues with the same
values: no state to checkpoint, the same on any number of ranks and after a resume.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .secret import NoiseKey

_MF_STREAM = 17  # beside the tree's (13) and the Gaussian mechanism's (11) streams


def inverse_column(c: np.ndarray, n: int) -> np.ndarray:
    """The first column u of C^-1 for the lower-triangular Toeplitz C with first column c (length b)."""
    u = np.zeros(n)
    u[0] = 1.0 / c[0]
    for t in range(1, n):
        k = min(t, len(c) - 1)
        u[t] = -np.dot(c[1 : k + 1], u[t - 1 :: -1][:k]) / c[0]
    return u


def prefix_error(c: np.ndarray, n: int) -> float:
    """||A C^-1||_F^2 for unit-norm c: the summed variance of the noise on the n prefix sums, in sigma^2."""
    c = c / np.linalg.norm(c)
    sums = np.cumsum(inverse_column(c, n))
    return float(np.dot(n - np.arange(n), sums * sums))


def optimise(n: int, bands: int) -> np.ndarray:
    """The optimal banded Toeplitz factor: the unit-norm b-banded Toeplitz c that minimises prefix_error (L-BFGS
    with numerical gradients); not the optimal general banded C."""
    bands = min(bands, n)
    start = np.array([math.comb(2 * i, i) / 4.0 ** i for i in range(bands)])
    if bands > 1:
        from scipy import optimize  # here, not at the top: every run imports this module, few optimise

        found = optimize.minimize(lambda c: prefix_error(c, n), start, method="L-BFGS-B",
                                  bounds=[(1e-6, None)] + [(None, None)] * (bands - 1))
        if found.fun < prefix_error(start, n):
            start = found.x
    return start / np.linalg.norm(start)


class BandedFactorisation:
    """The factorisation of an n-round run and each round's noise (C^-1 Z)_t, in units of sigma."""

    def __init__(self, rounds: int, bands: int):
        self.rounds, self.bands = rounds, min(bands, rounds)
        self.c = optimise(rounds, self.bands)
        self._cache = None  # (key, numel, device), the round of the last w, the last b - 1 w

    def round_noise(self, key: NoiseKey, round_idx: int, numel: int, device) -> torch.Tensor:
        """w_t, continuing the recursion from the previous round, or (first round, resume) from round 1."""
        ident = (key.secret, key.value, numel, str(device))
        if self._cache is not None and self._cache[0] == ident and self._cache[1] == round_idx:
            return self._cache[2][-1].clone()
        if self._cache is not None and self._cache[0] == ident and self._cache[1] == round_idx - 1:
            start, history = round_idx, self._cache[2]
        else:
            start, history = 1, []
        for t in range(start, round_idx + 1):
            w = key.normal([_MF_STREAM, t], (_MF_STREAM, 0, t), numel, device)
            for lag in range(1, min(self.bands, t)):
                w -= float(self.c[lag]) * history[-lag]
            w /= float(self.c[0])
            history = (history + [w])[-max(1, self.bands - 1):]
        self._cache = (ident, round_idx, history)
        return history[-1].clone()


def bands(cfg) -> int:
    """privacy.bands, or (0) the rounds between a client's participations, capped at train.rounds."""
    separation = max(1, cfg.partition.num_clients // cfg.train.clients_per_round)
    return min(cfg.privacy.bands or separation, cfg.train.rounds)


def participations(rounds: int, num_clients: int, clients_per_round: int) -> int:
    """k: the most rounds one client takes part in over `rounds` sequential rounds (at most one in any
    floor(N / m) consecutive rounds)."""
    return -(-rounds // max(1, num_clients // clients_per_round))

"""The client and server sides of distributed DP with secure aggregation (Kairouz, Liu & Steinke, ICML
2021, Algorithm 1 and Section 4; the same steps for the Skellam mechanism of Agarwal, Kairouz & Liu,
NeurIPS 2021). A client turns its update x into b-bit integers:

    1. clip:     x <- x min(1, c / ||x||_2)
    2. scale:    x <- s x                     (s = 1 / gamma, the integer grid's resolution)
    3. rotate:   x <- R(x)                    (the round's randomised Hadamard rotation, the same for every
                                               client, compression/rotation.py: it spreads the mass over
                                               coordinates, so fewer wrap)
    4. round:    z <- conditional randomised rounding with bound beta (secagg/rounding.py)
    5. noise:    z <- z + N_Z(0, sigma_s^2)   (discrete Gaussian, sigma_s = local sigma x s) or
                 z <- z + Skellam(sigma_s^2 / 2) (variance sigma_s^2); its own keyed draw
    6. wrap:     z <- z mod 2^b into [-2^(b-1), 2^(b-1))

and the server, from the modular sum of the survivors' vectors (what secure aggregation returns),
takes the signed representative, rotates back and divides by s. Every step is exact integer or float64
arithmetic from keyed draws, so the decoded sum is the same on any rank and after a resume."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..compression.rotation import Rotation
from ..secagg.modular import modular_clip
from ..secagg.rounding import conditional_round
from .discrete import discrete_gaussian, skellam

MECHANISMS = ("ddgauss", "skellam")


@dataclass(frozen=True)
class DistributedDP:
    mechanism: str  # ddgauss | skellam
    l2_clip: float
    bits: int
    scale: float  # s = 1 / gamma
    local_sigma: float  # each client's noise stddev in model units (0: no noise, for checks)
    beta: float = math.exp(-0.5)

    def __post_init__(self):
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"distributed DP: mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        if not 2 <= self.bits <= 62:
            raise ValueError(f"distributed DP: bits must be in [2, 62] (int64 sums), got {self.bits}")

    @property
    def bounds(self) -> tuple[int, int]:
        half = 2 ** (self.bits - 1)
        return -half, half

    def encode(self, x: torch.Tensor, rotation: Rotation, client_generator: torch.Generator) -> torch.Tensor:
        """Steps 1-6 for one client's update (float), as int64 in [-2^(b-1), 2^(b-1))."""
        wide = x.reshape(-1).to(torch.float64)
        norm = float(torch.linalg.vector_norm(wide))
        if norm > self.l2_clip:
            wide = wide * (self.l2_clip / norm)
        z = conditional_round(rotation.forward(wide * self.scale), self.beta, client_generator)
        sigma = self.local_sigma * self.scale
        if sigma > 0:
            noise = (discrete_gaussian(z.shape, sigma, client_generator) if self.mechanism == "ddgauss"
                     else skellam(z.shape, sigma**2 / 2, client_generator))
            z = z + noise
        return modular_clip(z, *self.bounds)

    def decode(self, modular_sum: torch.Tensor, rotation: Rotation) -> torch.Tensor:
        """The server's estimate (float64, the update's length) of the survivors' summed updates."""
        signed = modular_clip(modular_sum, *self.bounds).to(torch.float64)
        return rotation.inverse(signed) / self.scale

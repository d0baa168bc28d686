"""EDEN (Vargaftik, Ben-Basat, Portnoy, Mendelson, Ben-Itzhak & Mitzenmacher, "EDEN: communication-
efficient and robust distributed mean estimation for federated learning", ICML 2022), at b bits a
coordinate:

    y = R(x)                          (keyed randomised Hadamard rotation; n = padded size)
    q = Q_b(y sqrt(n) / ||x||_2)      (each coordinate to the nearest of the 2^b Lloyd-Max centroids of
                                       the standard normal: after the rotation the scaled coordinates
                                       are close to N(0, 1))
    send the centroid indices (n b bits) and S (one float32)
    x_hat = R^-1(S q)

with S = ||x||_2^2 / <y, q> (unbiased over the rotation, the paper's default; `unbiased: false` takes
S = <y, q> / ||q||^2, which minimises the error of one vector). At b = 1 the centroids are
+-sqrt(2 / pi) and EDEN is DRIVE. The centroids are computed here by Lloyd's iteration on the normal
density (`normal_centroids`). With the unbiased scale the vNMSE tends to D_b / (1 - D_b), D_b the
Lloyd-Max distortion of the standard normal (b = 1: pi/2 - 1 ~ 0.571); the tests recompute D_b by
numerical integration and compare the measured vNMSE. Message: n b + 32 bits. `rotation` as in DRIVE.
"""
from __future__ import annotations

import functools
import math

import torch

from .base import FLOAT32_BITS, Compressed, Compressor
from .rotation import ROTATIONS, rotated_size, rotation_kind


def _pdf(t: float) -> float:
    return math.exp(-0.5 * t * t) / math.sqrt(2 * math.pi) if math.isfinite(t) else 0.0


def _cdf(t: float) -> float:
    return 0.5 * (1 + math.erf(t / math.sqrt(2)))


@functools.lru_cache(maxsize=None)
def normal_centroids(bits: int, iterations: int = 2000) -> tuple[float, ...]:
    """The 2^bits centroids of the minimum-mean-squared-error (Lloyd-Max) quantiser of N(0, 1), ascending:
    Lloyd's iteration (bounds at midpoints, centroids at conditional means) from equal-probability
    cells, run to a fixed point in float64."""
    levels = 2**bits
    centroids = [math.sqrt(2) * _erfinv(2 * (i + 0.5) / levels - 1) for i in range(levels)]
    for _ in range(iterations):
        bounds = [-math.inf] + [(a + b) / 2 for a, b in zip(centroids, centroids[1:])] + [math.inf]
        updated = [(_pdf(lo) - _pdf(hi)) / (_cdf(hi) - _cdf(lo)) for lo, hi in zip(bounds, bounds[1:])]
        if max(abs(a - b) for a, b in zip(updated, centroids)) < 1e-15:
            centroids = updated
            break
        centroids = updated
    return tuple(centroids)


def _erfinv(y: float) -> float:
    """Inverse error function by Newton's method on math.erf (only seeds the centroid iteration)."""
    x = 0.0
    for _ in range(100):
        step = (math.erf(x) - y) / (2 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) < 1e-15:
            break
    return x


class Eden(Compressor):
    random = True

    def __init__(self, bits: int = 1, unbiased: bool = True, rotation: str = "hadamard"):
        if not 1 <= int(bits) <= 8:
            raise ValueError(f"EDEN: bits must be an integer in [1, 8], got {bits}")
        self.bit_width, self.unbiased, self.rotation = int(bits), bool(unbiased), rotation_kind(rotation)
        self.centroids = torch.tensor(normal_centroids(self.bit_width), dtype=torch.float64)

    def bits(self, numel: int) -> int:
        return rotated_size(numel, self.rotation) * self.bit_width + FLOAT32_BITS

    def compress(self, x, generator=None):
        rotation = ROTATIONS[self.rotation](x.numel(), self._generator(generator), x.device)
        y = rotation.forward(x)
        norm = torch.linalg.vector_norm(y)
        if norm == 0:
            return Compressed(torch.zeros_like(x), self.bits(x.numel()))
        centroids = self.centroids.to(x.device)
        bounds = (centroids[1:] + centroids[:-1]) / 2
        q = centroids[torch.bucketize(y * math.sqrt(rotation.size) / norm, bounds)]
        inner = torch.dot(y, q)
        scale = norm.square() / inner if self.unbiased else inner / q.square().sum()
        return Compressed(rotation.inverse(scale * q).to(x.dtype).view_as(x), self.bits(x.numel()))

"""The randomised Hadamard rotation R(x) = H D x / sqrt(n) of DRIVE, EDEN and distributed DP: x padded
with zeros to n = 2^m values, D a diagonal of random signs from the keyed generator, H the n x n
Walsh-Hadamard matrix (Sylvester's order), applied in O(n log n) by the fast transform. R is
orthonormal, so R^-1(y) = D H y / sqrt(n); both are computed in float64, so R^-1(R(x)) returns x up to
float64 rounding (tested).

The paper's analyses of DRIVE and EDEN (their unbiasedness and vNMSE limits) assume a uniformly random
rotation; the Hadamard rotation is what their experiments and everyone's code use, because it costs
O(n log n) and no memory. It is not exactly unbiased: on a 64-value vector, 16,000 keyed draws of DRIVE's
unbiased form average to the input with a relative error of 1.9% (tests/unit/test_compressors.py).
`UniformRotation` (a Haar-random orthogonal matrix, O(d^2) memory and O(d^3) to draw, refused above
MAX_UNIFORM values) is the paper's rotation, for studies of small segments that need the exact
unbiasedness."""
from __future__ import annotations

import math

import torch


def padded_size(numel: int) -> int:
    """The next power of two at or above numel (at least 1)."""
    return 1 << max(0, math.ceil(math.log2(max(numel, 1))))


def hadamard(x: torch.Tensor) -> torch.Tensor:
    """H x along the last dimension (its length a power of two), unnormalised: H H = n I."""
    n = x.shape[-1]
    lead = x.shape[:-1]
    y, half = x, 1
    while half < n:
        pairs = y.reshape(*lead, n // (2 * half), 2, half)
        y = torch.stack((pairs[..., 0, :] + pairs[..., 1, :], pairs[..., 0, :] - pairs[..., 1, :]), dim=-2)
        half *= 2
    return y.reshape(x.shape)


MAX_UNIFORM = 4096


class Rotation:
    """The randomised Hadamard rotation R for vectors of `numel` values, its signs drawn once from
    `generator`."""

    def __init__(self, numel: int, generator: torch.Generator, device=None):
        self.numel, self.size = numel, padded_size(numel)
        bits = torch.randint(0, 2, (self.size,), generator=generator)
        self.signs = (bits.to(torch.float64) * 2 - 1).to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        padded = torch.zeros(self.size, dtype=torch.float64, device=x.device)
        padded[: self.numel] = x.reshape(-1).to(torch.float64)
        return hadamard(padded * self.signs) / math.sqrt(self.size)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return (self.signs * hadamard(y) / math.sqrt(self.size))[: self.numel]


class UniformRotation:
    """A Haar-random orthogonal d x d matrix Q (the QR decomposition of a Gaussian matrix from
    `generator`, its columns' signs fixed by R's diagonal, Mezzadri 2007): R(x) = Q x, R^-1(y) = Q^T y."""

    def __init__(self, numel: int, generator: torch.Generator, device=None):
        if numel > MAX_UNIFORM:
            raise ValueError(f"rotation: uniform is for segments of at most {MAX_UNIFORM} values (it holds a d x d "
                             f"matrix), got {numel}; use rotation: hadamard")
        self.numel = self.size = numel
        q, r = torch.linalg.qr(torch.randn(numel, numel, generator=generator, dtype=torch.float64))
        self.matrix = (q * torch.sign(torch.diagonal(r))).to(device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matrix @ x.reshape(-1).to(torch.float64)

    def inverse(self, y: torch.Tensor) -> torch.Tensor:
        return self.matrix.T @ y


ROTATIONS = {"hadamard": Rotation, "uniform": UniformRotation}


def rotation_kind(name: str) -> str:
    if name not in ROTATIONS:
        raise ValueError(f"rotation must be one of {sorted(ROTATIONS)}, got {name!r}")
    return name


def rotated_size(numel: int, kind: str) -> int:
    return padded_size(numel) if kind == "hadamard" else numel

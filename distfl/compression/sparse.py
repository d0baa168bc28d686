"""Top-k and random-k sparsification (Stich, Cordonnier & Jaggi, "Sparsified SGD with memory",
NeurIPS 2018; Wangni et al. 2018 for rand-k's unbiased scaling).

k = the given `k`, or ceil(density * d) for a vector of d values (at least 1, at most d).

top-k keeps the k coordinates of largest magnitude (ties broken by torch.topk, deterministically on one
device) and zeroes the rest. Message: k float32 values plus their positions, as k int32 indices or a
d-bit bitmap, whichever is smaller: 32 k + min(32 k, d) bits.

rand-k keeps k coordinates drawn uniformly without replacement from the keyed generator. The server
draws the same positions from the same key (seed, round, client, segment), so only the values travel:
32 k bits. With `rescale` (the default) the kept values are multiplied by d / k, which makes the
decoded vector unbiased; without it rand-k is the contractive (biased) form used with error feedback.
At k = d both are the identity.
"""
from __future__ import annotations

import math

import torch

from .base import FLOAT32_BITS, Compressed, Compressor


class _Sparse(Compressor):
    def __init__(self, density: float | None = None, k: int | None = None):
        if (density is None) == (k is None):
            raise ValueError(f"{type(self).__name__}: give exactly one of density (0 < density <= 1) or k (>= 1)")
        if density is not None and not 0 < density <= 1:
            raise ValueError(f"{type(self).__name__}: density must be in (0, 1], got {density}")
        if k is not None and k < 1:
            raise ValueError(f"{type(self).__name__}: k must be >= 1, got {k}")
        self.density, self.k = density, k

    def kept(self, numel: int) -> int:
        k = self.k if self.k is not None else math.ceil(self.density * numel)
        return max(1, min(numel, k))


class TopK(_Sparse):
    def bits(self, numel: int) -> int:
        k = self.kept(numel)
        return FLOAT32_BITS * k + min(FLOAT32_BITS * k, numel)

    def compress(self, x, generator=None):
        flat = x.reshape(-1)
        k = self.kept(flat.numel())
        out = torch.zeros_like(flat)
        if k == flat.numel():
            out.copy_(flat)
        else:
            index = torch.topk(flat.abs(), k, sorted=False).indices
            out[index] = flat[index]
        return Compressed(out.view_as(x), self.bits(flat.numel()))

    def compress_rows(self, rows, generators=None):
        """Every row's top-k in one torch.topk over the pack."""
        k = self.kept(rows.shape[1])
        if k == rows.shape[1]:
            return rows.clone()
        index = torch.topk(rows.abs(), k, dim=1, sorted=False).indices
        return torch.zeros_like(rows).scatter_(1, index, rows.gather(1, index))


class RandK(_Sparse):
    random = True

    def __init__(self, density: float | None = None, k: int | None = None, rescale: bool = True):
        super().__init__(density, k)
        self.rescale = rescale
        self.unbiased = rescale

    def bits(self, numel: int) -> int:
        return FLOAT32_BITS * self.kept(numel)

    def compress(self, x, generator=None):
        flat = x.reshape(-1)
        d, k = flat.numel(), self.kept(flat.numel())
        if k == d:
            return Compressed(x.clone(), self.bits(d))
        index = torch.randperm(d, generator=self._generator(generator))[:k].to(flat.device)
        out = torch.zeros_like(flat)
        out[index] = flat[index] * (d / k) if self.rescale else flat[index]
        return Compressed(out.view_as(x), self.bits(d))

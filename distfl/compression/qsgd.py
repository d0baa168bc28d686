"""QSGD (Alistarh, Grubic, Li, Tomioka & Vojnovic, "QSGD: communication-efficient SGD via gradient
quantization and encoding", NeurIPS 2017, eq. (3)): with s levels,

    Q_s(x)_i = ||x||_2 * sign(x_i) * xi_i(x, s),
    xi_i = l / s        with probability 1 - (|x_i| s / ||x||_2 - l),
           (l + 1) / s  otherwise,   where l = floor(|x_i| s / ||x||_2),

which is unbiased (E Q_s(x) = x, the paper's Lemma 3.1). `bits` b >= 2 sets s = 2^(b-1) - 1, so that a
sign bit and the level fit in b bits a value. Message: the norm as one float32 and b bits a value,
32 + b d bits (the paper's fixed-width code; its Elias coding of the levels, shorter for small s, is
not modelled). The rounding is computed in float64 from uniforms of the keyed generator.
"""
from __future__ import annotations

import torch

from .base import FLOAT32_BITS, Compressed, Compressor


class QSGD(Compressor):
    unbiased = True
    random = True

    def __init__(self, bits: int = 8):
        if not 2 <= int(bits) <= 32:
            raise ValueError(f"QSGD: bits must be an integer in [2, 32] (a sign bit and the level), got {bits}")
        self.bit_width = int(bits)
        self.levels = 2 ** (self.bit_width - 1) - 1

    def bits(self, numel: int) -> int:
        return FLOAT32_BITS + self.bit_width * numel

    def compress(self, x, generator=None):
        generator = self._generator(generator)
        wide = x.to(torch.float64)
        norm = torch.linalg.vector_norm(wide)
        if norm == 0:
            return Compressed(torch.zeros_like(x), self.bits(x.numel()))
        scaled = wide.abs() / norm * self.levels
        low = scaled.floor()
        up = torch.rand(x.shape, generator=generator, dtype=torch.float64).to(x.device) < (scaled - low)
        level = low + up.to(torch.float64)
        return Compressed((norm * torch.sign(wide) * level / self.levels).to(x.dtype), self.bits(x.numel()))

    def compress_rows(self, rows, generators=None):
        """The pack at once: each row's norm, then one pass of rounding over the [pack, d] tensor (the
        uniforms drawn row by row, each from its client's generator)."""
        if generators is None or len(generators) != rows.shape[0]:
            raise ValueError("QSGD draws at random: pass one keyed generator a row (keyed_generator)")
        wide = rows.to(torch.float64, copy=True)  # rounded in place below
        norm = torch.stack([torch.linalg.vector_norm(row) for row in wide]).unsqueeze(1)
        uniforms = torch.empty(wide.shape, dtype=torch.float64)
        for row, g in zip(uniforms, generators):
            torch.rand(rows.shape[1], generator=g, dtype=torch.float64, out=row)
        scaled = wide.abs_().div_(norm.where(norm > 0, 1.0)).mul_(self.levels)  # a zero row stays zero
        low = scaled.floor()
        level = low + (uniforms.to(rows.device) < (scaled - low)).to(torch.float64)
        return (norm * torch.sign(rows).to(torch.float64) * level / self.levels).to(rows.dtype)

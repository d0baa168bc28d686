"""Scaled sign (Karimireddy, Rebjock, Stich & Jaggi, "Error feedback fixes SignSGD and other gradient
compression schemes", ICML 2019, Algorithm 1's compressor): C(p) = (||p||_1 / d) sign(p). The scale
makes it a delta-approximate compressor, the form their error feedback (EF-SignSGD) needs. Message: one
bit a value and one float32 scale: d + 32 bits. sign(0) is sent as +1 (one bit cannot say 0)."""
from __future__ import annotations

import torch

from .base import FLOAT32_BITS, Compressed, Compressor


class ScaledSign(Compressor):
    def bits(self, numel: int) -> int:
        return numel + FLOAT32_BITS

    def compress(self, x, generator=None):
        scale = x.abs().sum(dtype=torch.float64) / max(x.numel(), 1)
        signs = torch.where(x < 0, -1.0, 1.0).to(torch.float64)
        return Compressed((scale * signs).to(x.dtype), self.bits(x.numel()))

"""DRIVE (Vargaftik, Ben-Basat, Portnoy, Mendelson, Ben-Itzhak & Mitzenmacher, "DRIVE: one-bit
distributed mean estimation", NeurIPS 2021): rotate, send one bit a coordinate and one scale.

    y = R(x)                      (the keyed randomised Hadamard rotation, rotation.py; n = padded size)
    send sign(y) (n bits) and S   (one float32)
    x_hat = R^-1(S sign(y))

S = ||y||_1 / n minimises ||x_hat - x||^2 (the paper's biased DRIVE; its vNMSE tends to 1 - 2/pi ~ 0.363
for a uniform random rotation as d grows); S = ||x||_2^2 / ||y||_1 makes the estimate unbiased over the
rotation (the paper's unbiased DRIVE, vNMSE tending to pi/2 - 1 ~ 0.571), the form for averaging many
clients. `unbiased` (default true) chooses. Message: n + 32 bits. The Hadamard rotation approximates
the paper's uniform rotation (as the paper's own experiments use it): `rotation: uniform` takes the
paper's (small segments only; rotation.py says what each costs and how far the Hadamard form is from
unbiased). The vNMSE measured with the Hadamard rotation at large d is checked against the two limits
in the tests.
"""
from __future__ import annotations

import torch

from .base import FLOAT32_BITS, Compressed, Compressor
from .rotation import ROTATIONS, rotated_size, rotation_kind


class Drive(Compressor):
    random = True

    def __init__(self, unbiased: bool = True, rotation: str = "hadamard"):
        self.unbiased, self.rotation = bool(unbiased), rotation_kind(rotation)

    def bits(self, numel: int) -> int:
        return rotated_size(numel, self.rotation) + FLOAT32_BITS

    def compress(self, x, generator=None):
        rotation = ROTATIONS[self.rotation](x.numel(), self._generator(generator), x.device)
        y = rotation.forward(x)
        l1 = y.abs().sum()
        if l1 == 0:
            return Compressed(torch.zeros_like(x), self.bits(x.numel()))
        scale = y.square().sum() / l1 if self.unbiased else l1 / rotation.size
        signs = torch.where(y < 0, -1.0, 1.0).to(torch.float64)
        return Compressed(rotation.inverse(scale * signs).to(x.dtype).view_as(x), self.bits(x.numel()))

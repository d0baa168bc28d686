"""The server's model as it travels to the clients (`compression.down`; Caldas, Konečný, McMahan &
Talwalkar, "Expanding the reach of federated learning by reducing client resource requirements", 2018:
lossy compression of the server-to-client model).

The server keeps its float32 model; each client of a round receives `decode(model)`, the same for every
client of the round, and trains from it.

- `fp16`, `bf16`: every parameter rounded to a 16-bit float. 16 d bits.
- `qsgd` at b bits: each parameter tensor (a weight, a bias) quantised on its own as QSGD does an update
  (qsgd.py: its norm, signs and stochastic levels, s = 2^(b-1) - 1), the rounding drawn from a generator
  keyed by (seed, round, tensor): the same on every rank and after a resume. Unbiased. Sum over the
  tensors of 32 + b n_t bits.
"""
from __future__ import annotations

import torch

from .base import keyed_generator
from .floats import HalfPrecision
from .qsgd import QSGD

_KEY = 0xD0A1  # keeps the download's rounding apart from every other keyed stream of the run
KINDS = ("none", "fp16", "bf16", "qsgd")


class ModelDownload:
    def __init__(self, kind: str, bits: int, slices: list[slice], seed: int):
        """`slices`: where each parameter tensor lies in the flat model (qsgd quantises each on its own)."""
        if kind not in KINDS:
            raise ValueError(f"model download: kind must be one of {', '.join(KINDS)}, got {kind!r}")
        self.kind, self.slices, self.seed = kind, list(slices), seed
        self.compressor = QSGD(bits) if kind == "qsgd" else HalfPrecision(kind) if kind in ("fp16", "bf16") else None

    def bits(self, numel: int) -> int:
        """The encoded size of a model of `numel` parameters, in bits."""
        if self.compressor is None:
            return 32 * numel
        if self.kind == "qsgd":
            return sum(self.compressor.bits(where.stop - where.start) for where in self.slices)
        return self.compressor.bits(numel)

    def decode(self, params: torch.Tensor, round_idx: int) -> torch.Tensor:
        """The model a client of round `round_idx` receives for the server's `params` (a new tensor)."""
        if self.compressor is None:
            return params.clone()
        if self.kind != "qsgd":
            return self.compressor.compress(params).decoded
        out = params.clone()
        for index, where in enumerate(self.slices):
            generator = keyed_generator(self.seed, _KEY, round_idx, index)
            out[where] = self.compressor.compress(params[where], generator).decoded
        return out

"""Half-precision transport (pfl-research's bf16/fp16 transport): each value travels as a 16-bit float
and the server widens it back to float32. Message: 16 d bits. Values beyond fp16's range (65504)
become inf and the round's non-finite check refuses them, as it refuses any non-finite update."""
from __future__ import annotations

import torch

from .base import Compressed, Compressor

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class HalfPrecision(Compressor):
    def __init__(self, dtype: str = "bf16"):
        if dtype not in DTYPES:
            raise ValueError(f"HalfPrecision: dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.dtype = dtype

    def bits(self, numel: int) -> int:
        return 16 * numel

    def compress(self, x, generator=None):
        return Compressed(x.to(DTYPES[self.dtype]).to(x.dtype), self.bits(x.numel()))

    def compress_rows(self, rows, generators=None):
        return rows.to(DTYPES[self.dtype]).to(rows.dtype)

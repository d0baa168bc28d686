"""Error feedback (Stich, Cordonnier & Jaggi 2018, "memory"; Karimireddy et al. 2019, EF-SGD): a client
keeps what compression dropped and adds it to its next update,

    p_t = x_t + e_t,   sent_t = C(p_t),   e_(t+1) = p_t - sent_t,

so nothing is lost, only delayed: sum_t sent_t + e_T = sum_t x_t (telescoping; exact wherever the
arithmetic is, e.g. for top-k on values whose sums are exact in float32, otherwise to float rounding).
The residual is float32, one vector a client, held in the client's state like SCAFFOLD's control.
"""
from __future__ import annotations

import torch

from .base import Compressed, Compressor


class ErrorFeedback:
    def __init__(self, compressor: Compressor):
        self.compressor = compressor

    def compress(self, x: torch.Tensor, residual: torch.Tensor | None,
                 generator: torch.Generator | None = None) -> tuple[Compressed, torch.Tensor]:
        """(what is sent, the new residual) for update `x` and the client's residual (None = zero)."""
        corrected = x if residual is None else x + residual
        sent = self.compressor.compress(corrected, generator)
        return sent, corrected - sent.decoded

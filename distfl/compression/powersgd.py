"""PowerSGD (Vogels, Karimireddy & Jaggi, "PowerSGD: practical low-rank gradient compression for
distributed optimization", NeurIPS 2019, Algorithm 1), applied to one client's update: a segment
reshaped to a matrix M (n x m: a weight's first dimension by the rest) is sent as rank-r factors found
by one step of subspace iteration, warm-started from the previous round's Q:

    P = M Q,   P <- orthonormalise(P) (Gram-Schmidt, here a reduced QR),   Q = M^T P,   M_hat = P Q^T

Message: r (n + m) float32 values. Q (m x r) is the compressor's state for the next round, kept with the
client's state like SCAFFOLD's control (the paper keeps one Q for all workers because their P and Q are
averaged by all-reduce; a federated client compresses alone, so it keeps its own). The first Q is drawn
from the keyed generator (standard normal). A vector (a bias) or a matrix whose rank-r factors would
cost more than the matrix itself is sent uncompressed, as the paper does for biases. At r >= min(n, m)
the factors reproduce M to float rounding.
"""
from __future__ import annotations

import torch

from .base import FLOAT32_BITS, Compressed, Compressor


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int] | None:
    """(n, m) for a weight of `shape`, or None for a vector."""
    if len(shape) < 2:
        return None
    n = shape[0]
    m = 1
    for size in shape[1:]:
        m *= size
    return n, m


class PowerSGD(Compressor):
    random = True

    def __init__(self, rank: int = 4):
        if int(rank) < 1:
            raise ValueError(f"PowerSGD: rank must be >= 1, got {rank}")
        self.rank = int(rank)

    def compresses(self, shape: tuple[int, ...]) -> bool:
        dims = matrix_shape(shape)
        return dims is not None and self.rank * (dims[0] + dims[1]) < dims[0] * dims[1]

    def bits_of(self, shape: tuple[int, ...]) -> int:
        if not self.compresses(shape):
            return FLOAT32_BITS * int(torch.Size(shape).numel())
        n, m = matrix_shape(shape)
        return FLOAT32_BITS * self.rank * (n + m)

    def compress_matrix(self, x: torch.Tensor, q: torch.Tensor | None,
                        generator: torch.Generator | None = None) -> tuple[Compressed, torch.Tensor | None]:
        """(what is sent, the next Q) for a weight-shaped update x; q the client's previous Q or None."""
        if not self.compresses(tuple(x.shape)):
            return Compressed(x.clone(), self.bits_of(tuple(x.shape))), None
        n, m = matrix_shape(tuple(x.shape))
        matrix = x.reshape(n, m).to(torch.float64)
        if q is None:
            q = torch.randn(m, self.rank, generator=self._generator(generator), dtype=torch.float64).to(x.device)
        p, _ = torch.linalg.qr(matrix @ q.to(torch.float64))
        q_next = matrix.T @ p
        decoded = (p @ q_next.T).to(x.dtype).reshape(x.shape)
        return Compressed(decoded, self.bits_of(tuple(x.shape))), q_next.to(torch.float32)

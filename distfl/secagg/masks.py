"""Secure aggregation's masks, simulated exactly (Bonawitz et al., "Practical secure aggregation for
privacy-preserving machine learning", CCS 2017; SecAgg+, Bell et al., CCS 2020).

Each client i holds its input x_i as integers modulo 2^b and sends

    y_i = x_i + PRG(b_i) + sum_{j > i, j ~ i} PRG(s_ij) - sum_{j < i, j ~ i} PRG(s_ij)   (mod 2^b)

where j ~ i are i's neighbours (every other client in SecAgg's complete graph; k of them in SecAgg+'s
k-regular graph), s_ij the pair's agreed key and b_i a self-mask. Summed over the clients that sent,
the pairwise masks of two senders cancel; the server removes the rest with what the survivors reveal
(Shamir shares, here read directly): the self-masks of the senders, and the pairwise masks between a
sender and a neighbour that dropped after the keys were shared. What is simulated is the arithmetic of
the masks and who must reveal what, not the cryptography: the PRG is torch's generator keyed by
(run secret, round, pair), which stands in for a key agreement and a cryptographic PRG.

A round fails when fewer than `threshold` clients survive (the secrets cannot be reconstructed)."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch


def _prg(numel: int, bits: int, *key: int) -> torch.Tensor:
    digest = hashlib.blake2b(struct.pack(f"<{len(key)}q", *key), digest_size=8, person=b"distfl-mask").digest()
    generator = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
    return torch.randint(0, 2**bits, (numel,), generator=generator, dtype=torch.int64)


def neighbours(clients: list[int], degree: int | None, secret: int, round_idx: int) -> dict[int, set[int]]:
    """Each client's neighbours: all others (degree None: SecAgg), or a k-regular-like graph (SecAgg+)
    drawn from the round's key: the clients in a keyed random order on a ring, each joined to the
    degree // 2 nearest on either side (Bell et al.'s Harary graph, randomly labelled)."""
    if degree is None or degree >= len(clients) - 1:
        return {c: set(clients) - {c} for c in clients}
    order = torch.randperm(len(clients), generator=torch.Generator().manual_seed(
        int.from_bytes(hashlib.blake2b(struct.pack("<qq", secret, round_idx), digest_size=8).digest(), "little") >> 1))
    ring = [sorted(clients)[int(i)] for i in order]
    half = max(1, degree // 2)
    graph = {c: set() for c in clients}
    for position, c in enumerate(ring):
        for step in range(1, half + 1):
            other = ring[(position + step) % len(ring)]
            graph[c].add(other)
            graph[other].add(c)
    return graph


@dataclass
class MaskedRound:
    """One round's masking among `clients` (ids), inputs modulo 2^bits of `numel` values."""

    clients: list[int]
    numel: int
    bits: int
    secret: int
    round_idx: int
    degree: int | None = None

    def __post_init__(self):
        self.graph = neighbours(self.clients, self.degree, self.secret, self.round_idx)
        self.modulus = 2**self.bits

    def _pair_mask(self, i: int, j: int) -> torch.Tensor:
        low, high = min(i, j), max(i, j)
        return _prg(self.numel, self.bits, self.secret, self.round_idx, 0, low, high)

    def _self_mask(self, i: int) -> torch.Tensor:
        return _prg(self.numel, self.bits, self.secret, self.round_idx, 1, i, i)

    def masked(self, client: int, x: torch.Tensor) -> torch.Tensor:
        """What `client` sends for its input x (int64 in [0, 2^bits))."""
        y = x + self._self_mask(client)
        for other in self.graph[client]:
            y = y + self._pair_mask(client, other) if client < other else y - self._pair_mask(client, other)
        return torch.remainder(y, self.modulus)

    def unmask(self, total: torch.Tensor, senders: set[int]) -> torch.Tensor:
        """The sum of the senders' inputs modulo 2^bits from the sum of what they sent: removes their
        self-masks and their masks with neighbours that dropped."""
        y = total.clone()
        for client in senders:
            y -= self._self_mask(client)
            for other in self.graph[client] - senders:
                y = y - self._pair_mask(client, other) if client < other else y + self._pair_mask(client, other)
        return torch.remainder(y, self.modulus)

    def revealed(self, senders: set[int]) -> int:
        """How many secrets the survivors must help reconstruct: one self-mask seed per sender and one
        pairwise key per dropped client that has a sender as neighbour."""
        dropped = {c for c in self.clients if c not in senders and self.graph[c] & senders}
        return len(senders) + len(dropped)

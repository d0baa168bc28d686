"""What every compressor shares: its result, its interface and its keyed randomness."""
from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import torch

FLOAT32_BITS = 32


@dataclass(frozen=True)
class Compressed:
    decoded: torch.Tensor  # float32, the input's shape: what the server adds into its sum
    bits: int  # the encoded message's exact size in bits (closed form of the compressor)

    @property
    def nbytes(self) -> int:
        """Whole bytes on the wire: the bits rounded up to a byte."""
        return (self.bits + 7) // 8


class Compressor:
    """A compressor of one float32 vector. `unbiased` says whether E[decoded] = input over the keyed
    draws (the tests check it where it is claimed); `random` whether `compress` draws from `generator`."""

    unbiased = False
    random = False

    def compress(self, x: torch.Tensor, generator: torch.Generator | None = None) -> Compressed:
        raise NotImplementedError

    def compress_rows(self, rows: torch.Tensor, generators: list | None = None) -> torch.Tensor:
        """The decoded vectors of a pack of clients' updates, one a row of `rows` ([pack, d]), each with its
        own keyed generator (`generators`, one a row, for a random compressor): the rows `compress` gives
        one at a time, bit for bit. This default loops over the rows; a compressor that can vectorise over
        the pack overrides it."""
        generators = generators if generators is not None else [None] * rows.shape[0]
        return torch.stack([self.compress(row, g).decoded for row, g in zip(rows, generators)])

    def bits(self, numel: int) -> int:
        """The encoded size in bits of a vector of `numel` values (every compressor here has a size that
        depends only on numel, which the clock can read before a client trains)."""
        raise NotImplementedError

    def _generator(self, generator: torch.Generator | None) -> torch.Generator:
        if generator is None:
            raise ValueError(f"{type(self).__name__} draws at random: pass a keyed generator (keyed_generator)")
        return generator


def keyed_generator(*key: int) -> torch.Generator:
    """A CPU generator seeded by a hash of the integers `key` (seed, round, client, segment, ...): the
    same key gives the same draws on every rank and after a resume; a key that differs in any part gives
    an unrelated stream (BLAKE2b of the packed key, 63 bits of it as the seed)."""
    digest = hashlib.blake2b(struct.pack(f"<{len(key)}q", *key), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)

"""Clients' index arrays held as one int64 array cut at offsets: client k's indices are
flat[offsets[k]:offsets[k + 1]], a view. A natural federation (its clients' samples end to end) is held by
its offsets alone (client k: arange(offsets[k], offsets[k + 1]), made when asked for): no per-client or
per-sample work at all; a partition drawn per client is concatenated once."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class Parts(Sequence):
    """A read-only sequence of int64 index arrays, one per client, stored end to end."""

    def __init__(self, flat: np.ndarray | None, offsets: np.ndarray):
        """`flat` None: the ranges of `offsets` (Parts.ranges), never stored until `flat` is read."""
        self._flat = None if flat is None else np.asarray(flat, dtype=np.int64)
        self.offsets = np.asarray(offsets, dtype=np.int64)

    @property
    def flat(self) -> np.ndarray:
        """Every client's indices end to end (for ranges: arange(offsets[-1]), made on first use)."""
        if self._flat is None:
            self._flat = np.arange(self.offsets[-1], dtype=np.int64)
        return self._flat

    @property
    def is_ranges(self) -> bool:
        """Whether client k holds exactly arange(offsets[k], offsets[k + 1]) (its flat is never stored)."""
        return self._flat is None

    @classmethod
    def of(cls, parts) -> Parts:
        """`parts` (a Parts, or any sequence of index arrays) as Parts: the same arrays, as int64."""
        if isinstance(parts, Parts):
            return parts
        arrays = [np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]
        offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum(np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays)), out=offsets[1:])
        flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        return cls(flat, offsets)

    @classmethod
    def ranges(cls, offsets: np.ndarray) -> Parts:
        """Client k holds arange(offsets[k], offsets[k + 1]): a natural federation's clients."""
        return cls(None, offsets)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        k = int(k)
        n = len(self)
        if k < -n or k >= n:
            raise IndexError(f"client {k} out of range for {n} clients")
        k %= n
        if self._flat is None:
            return np.arange(self.offsets[k], self.offsets[k + 1], dtype=np.int64)
        return self._flat[self.offsets[k]:self.offsets[k + 1]]

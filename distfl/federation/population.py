"""Clients, cohorts and placement: pure functions of the seed, so every rank agrees without talking."""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from ..data.parts import Parts
from ..errors import ConfigError, DataError

# Distinct streams for distinct purposes, so adding a random draw in one never shifts another.
_COHORT_STREAM = 1
_CLIENT_STREAM = 2
_POISSON_STREAM = 3


class Population:
    def __init__(self, parts, labels: np.ndarray | None = None, num_classes: int = 0):
        """`parts`: each client's int64 index array, as a list or as Parts (a natural federation's, which
        costs nothing per client here: sizes, class counts and the fingerprint are array operations)."""
        self.indices = Parts.of(parts)
        self.sizes = self.indices.sizes
        # class_counts[k, c]: samples of class c held by client k (label-histogram methods, reports), counted
        # when first read: a run that never reads them (FedAvg on a natural federation) never pays for them.
        self._labels, self._num_classes, self._class_counts = labels, num_classes, None
        # token_counts[k]: client k's non-padding target tokens (algorithm.weighting=tokens; set by the runner)
        self.token_counts: np.ndarray | None = None

    @property
    def class_counts(self) -> np.ndarray:
        """class_counts[k, c]: samples of class c held by client k; DataError where the samples have no
        class (a next-token dataset: data/tokens.py)."""
        if self._labels is None:
            raise DataError("this run needs each client's samples counted by class (a label-histogram method or "
                            "per-client test sets drawn by class), but the data's samples have no class (a next-token "
                            "task): use a method without class counts")
        if self._class_counts is None:  # one bincount over (client, label) pairs: O(samples), not O(clients) calls
            clients, classes = len(self.indices), self._num_classes
            owner = np.repeat(np.arange(clients, dtype=np.int64), self.sizes)
            labels = np.asarray(self._labels)
            bounds = self.indices.offsets
            owned = labels[bounds[0]:bounds[-1]] if self.indices.is_ranges else labels[self.indices.flat]
            self._class_counts = np.bincount(owner * classes + owned, minlength=clients * classes).reshape(clients, classes)
        return self._class_counts

    def __len__(self) -> int:
        return len(self.indices)

    def cohort(self, seed: int, round_idx: int, size: int, rule: str = "random") -> list[int]:
        """The clients of round `round_idx` (1-based): distinct ids, sorted, from (seed, round) only.

        random: `size` ids, a seeded sample without replacement. sequential: ids (t-1)*size ... t*size-1
        (mod N), so each round meets fresh clients while N >= rounds * size (cross-device simulations,
        FedFOR). poisson: each client joins independently with probability size / N, so the cohort has
        `size` clients on average and any number from 0 to N (the sampling DP accountants assume).
        """
        if rule == "poisson":
            rng = np.random.default_rng([seed, _POISSON_STREAM, round_idx])
            return [int(c) for c in np.flatnonzero(rng.random(len(self)) < size / len(self))]
        if size >= len(self):
            return list(range(len(self)))
        if rule == "sequential":
            return sorted(((round_idx - 1) * size + i) % len(self) for i in range(size))
        rng = np.random.default_rng([seed, _COHORT_STREAM, round_idx])
        return sorted(int(c) for c in rng.choice(len(self), size=size, replace=False))

    def fingerprint(self) -> int:
        """A 62-bit digest of the partition, to check that all ranks built the same one."""
        digest = hashlib.sha256()
        digest.update(self.sizes.astype("<i8").tobytes())  # the sizes cut the concatenation into clients
        digest.update(self.indices.flat.astype("<i8").tobytes())  # every client's indices, end to end
        return int.from_bytes(digest.digest()[:8], "little") >> 2


class DeviceIndices:
    """`Population.indices` as int64 tensors on `device`, each made when first used and then kept: set-up
    costs nothing per client, so a population of 342,477 clients starts as fast as one of 1,000."""

    def __init__(self, indices: Parts, device):
        self._indices, self._device, self._made = indices, device, {}

    def __len__(self) -> int:
        return len(self._indices)

    def __getitem__(self, client: int) -> torch.Tensor:
        tensor = self._made.get(client)
        if tensor is None:
            tensor = self._made[client] = torch.from_numpy(self._indices[client]).to(self._device)
        return tensor


def client_seed(seed: int, round_idx: int, client_id: int) -> int:
    """Seed of a client's local randomness (batch order, augmentation, dropout): never depends on rank."""
    return int(np.random.SeedSequence([seed, _CLIENT_STREAM, round_idx, client_id]).generate_state(1)[0])


def place(cohort: list[int], sizes: np.ndarray, world_size: int, sticky: bool) -> list[list[int]]:
    """Assign the cohort to ranks; returns one list of client ids per rank, each in ascending order.

    sticky: client c always lives on rank c % world_size (its state stays where it is).
    otherwise: longest-processing-time first by sample count, ties to the lower rank, deterministic.
    """
    ranks: list[list[int]] = [[] for _ in range(world_size)]
    if sticky:
        for c in cohort:
            ranks[c % world_size].append(c)
    else:
        load = [0] * world_size
        for c in sorted(cohort, key=lambda c: (-int(sizes[c]), c)):
            r = min(range(world_size), key=lambda r: (load[r], r))
            ranks[r].append(c)
            load[r] += int(sizes[c])
    return [sorted(r) for r in ranks]


def place_packs(cohort: list[int], sizes: np.ndarray, world_size: int, pack_size: int) -> list[list[list[int]]]:
    """Cut the cohort, in its (sorted) order, into packs of `pack_size` clients (the last may be smaller)
    and deal whole packs to ranks; returns each rank's packs, in cohort order.

    The packs depend only on the cohort and `pack_size`, never on the world size, so a client trains
    in the same pack (the same vectorised computation) on any number of ranks. Dealing: longest
    processing time first by the pack's samples, ties to the lower rank, as `place`.
    """
    packs = [cohort[i : i + pack_size] for i in range(0, len(cohort), pack_size)]
    ranks: list[list[list[int]]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for pack in sorted(packs, key=lambda p: (-int(sum(sizes[c] for c in p)), p[0])):
        r = min(range(world_size), key=lambda r: (load[r], r))
        ranks[r].append(pack)
        load[r] += int(sum(sizes[c] for c in pack))
    return [sorted(r) for r in ranks]


def sticky_placement(cfg, algorithm) -> bool:
    """runtime.placement: whether every client is hosted by the same rank in every round (client c on rank
    c % world_size); auto: where a stateful method keeps its clients' state in memory."""
    placement, store = cfg.runtime.placement, cfg.runtime.client_state
    if algorithm.stateful and store == "memory" and placement == "balanced":
        raise ConfigError(
            f"algorithm.name={cfg.algorithm.name} keeps per-client state in memory on the hosting "
            "rank, so runtime.placement must be auto or sticky (or set runtime.client_state=disk)")
    if placement == "auto":
        return algorithm.stateful and store == "memory"
    return placement == "sticky"

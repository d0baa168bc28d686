"""DP-FTRL's noise: tree aggregation with restarts (Kairouz, McMahan, Song, Thakkar, Thakurta and Xu,
"Practical and Private (Deep) Learning without Sampling or Shuffling", ICML 2021, Sec. 3 and App. D).

DP-FTRL releases noisy *prefix sums* of the clipped per-round sums x_1, x_2, ...: S~_j = x_1 + ... + x_j
+ n_j. The binary tree mechanism builds n_j from one Gaussian per dyadic block of rounds ("node"): block
(level l, end e) covers rounds e - 2^l + 1 ... e, and [1, j] is the disjoint union of one block per set
bit of j, so n_j is the sum of popcount(j) <= ceil(log2(j + 1)) independent node noises of std sigma:

    Var(n_j) = popcount(j) * sigma^2 per coordinate.

A client that takes part in round i moves exactly the nodes whose blocks hold i, at most one per level:
ceil(log2(L + 1)) of them in a tree of L rounds, each by at most its clip. With restarts every L rounds
(a fresh tree, prefix sums from the tree's first round) and each client in at most one round per tree,
each tree is a Gaussian mechanism of L2 sensitivity C sqrt(ceil(log2(L + 1))) and the trees compose:
RDP(alpha) = trees * alpha * ceil(log2(L + 1)) / (2 z^2) under zero-out (REPLACE_SPECIAL) adjacency,
which is what dp-accounting's SingleEpochTreeAggregationDpEvent computes (accountant.py).

distfl's server step consumes a per-round update, so a round releases the difference
S~_j - S~_{j-1} = x_j + (n_j - n_{j-1}) (S~_0 = 0 at each tree's start): post-processing of the prefix
sums, and with server sgd at lr 1 the global model after round j is the initial model plus S~_j, i.e.
DP-FTRL. n_j - n_{j-1} is computed from the nodes that enter and leave the decomposition, each drawn from (key, tree,
level, end) (secret mode: the CSPRNG's stream of (level, the run's round the block ends at), csprng.py):
every rank draws the same, and a resumed run needs no state.
"""
from __future__ import annotations

import torch

from .secret import NoiseKey

_TREE_STREAM = 13  # beside mechanism.py's noise stream (11) and population.py's


def nodes(j: int) -> list[tuple[int, int]]:
    """The dyadic blocks (level, end) whose disjoint union is rounds 1..j of a tree, largest first."""
    out, end = [], 0
    for level in reversed(range(j.bit_length())):
        if j >> level & 1:
            end += 1 << level
            out.append((level, end))
    return out


def node_noise(key: NoiseKey, tree: int, node: tuple[int, int], rounds_per_tree: int, numel: int,
               device) -> torch.Tensor:
    """The standard normal vector of one node, the same on every rank and after a resume."""
    level, end = node
    return key.normal([_TREE_STREAM, tree, level, end], (_TREE_STREAM, level, tree * rounds_per_tree + end),
                      numel, device)


class TreeAggregation:
    """The schedule of trees (a restart every `rounds_per_tree` rounds) and each round's noise."""

    def __init__(self, rounds_per_tree: int):
        self.rounds_per_tree = rounds_per_tree

    def position(self, round_idx: int) -> tuple[int, int]:
        """(tree, j): round `round_idx` (1-based) is the j-th (1-based) of tree `tree` (0-based)."""
        tree, offset = divmod(round_idx - 1, self.rounds_per_tree)
        return tree, offset + 1

    def prefix_noise(self, key: NoiseKey, round_idx: int, numel: int, device) -> torch.Tensor:
        """n_j, the standard-normal noise on the prefix sum of the tree up to this round (sigma = 1)."""
        tree, j = self.position(round_idx)
        total = torch.zeros(numel, dtype=torch.float64, device=device)
        for node in nodes(j):
            total += node_noise(key, tree, node, self.rounds_per_tree, numel, device)
        return total

    def round_noise(self, key: NoiseKey, round_idx: int, numel: int, device) -> torch.Tensor:
        """n_j - n_{j-1}: the node that enters the decomposition minus the nodes it replaces."""
        tree, j = self.position(round_idx)
        now, before = nodes(j), nodes(j - 1)
        total = torch.zeros(numel, dtype=torch.float64, device=device)
        for node in now:
            if node not in before:
                total += node_noise(key, tree, node, self.rounds_per_tree, numel, device)
        for node in before:
            if node not in now:
                total -= node_noise(key, tree, node, self.rounds_per_tree, numel, device)
        return total


def rounds_per_tree(num_clients: int, clients_per_round: int) -> int:
    """train.cohort=sequential takes clients (t-1) m ... t m - 1 (mod N) in round t: any floor(N / m)
    consecutive rounds meet floor(N / m) m <= N distinct clients, so a tree of that many rounds holds each
    client at most once (one epoch when m divides N)."""
    return max(1, num_clients // clients_per_round)

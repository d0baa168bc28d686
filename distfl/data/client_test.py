"""Each client's local test set (eval.clients): by default (eval.client_split=test) drawn from the test
split with the client's own label distribution, the convention of FedBN and of personalised-FL papers;
with eval.client_split=holdout, a held-out fraction of the client's own training data (see `holdout_split`).

Client k with n_k training samples, n_kc of class c, gets a test set of size S_k:
  S_k = eval.client_test_size, or (0, the default) its share of the test split, max(1, round(n_k |test| / |train|));
  m_kc = S_k n_kc / n_k, rounded by largest remainder (ties to the lower class) so that sum_c m_kc = S_k;
  m_kc samples of class c drawn without replacement from the test split's samples of that class (all of
  them if it has fewer, so S_k can then be smaller), from the generator keyed by (seed, client) alone.
Different clients draw independently, so two clients may share test samples (as two clients with the
same distribution would). The sets do not depend on the number of ranks, the round or the method.
"""
from __future__ import annotations

import numpy as np

_CLIENT_TEST_STREAM = 3  # distinct from population.py's cohort (1) and client (2) streams
_HOLDOUT_STREAM = 4


def class_quota(counts: np.ndarray, size: int) -> np.ndarray:
    """`size` split over classes in proportion to `counts`, by largest remainder (ties: lower class)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0 or size == 0:
        return np.zeros_like(counts)
    exact = counts * size  # quota times `total`, in integers, so the remainders compare exactly
    quota = exact // total
    left = size - int(quota.sum())
    order = sorted(range(len(counts)), key=lambda c: (-(int(exact[c]) % total), c))
    quota[order[:left]] += 1
    return quota


def client_test_sets(class_counts: np.ndarray, test_labels: np.ndarray, size: int, seed: int) -> list[np.ndarray]:
    """Test-split indices of every client's local test set (sorted); `class_counts[k, c]` = n_kc."""
    test_labels = np.asarray(test_labels)
    by_class = [np.flatnonzero(test_labels == c) for c in range(class_counts.shape[1])]
    share = len(test_labels) / max(int(class_counts.sum()), 1)
    sets = []
    for k, counts in enumerate(class_counts):
        n_k = int(counts.sum())
        size_k = size if size > 0 else max(1, round(n_k * share)) if n_k else 0
        rng = np.random.default_rng([seed, _CLIENT_TEST_STREAM, k])
        drawn = [rng.choice(by_class[c], size=min(int(m), len(by_class[c])), replace=False)
                 for c, m in enumerate(class_quota(counts, size_k)) if m > 0]
        sets.append(np.sort(np.concatenate(drawn)) if drawn else np.zeros(0, dtype=np.int64))
    return sets


def holdout_split(parts: list[np.ndarray], labels: np.ndarray, fraction: float,
                  seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(training, held-out) train-split indices of every client, for eval.client_split=holdout: disjoint,
    together the client's partition; the training part keeps the partition's order, the held-out is sorted.

    Client k with n_k samples holds out h_k = min(n_k - 1, max(1, round(fraction * n_k))) of them (round:
    to nearest, ties to even), so a client with >= 2 samples holds out at least 1 and keeps at least 1,
    and one with 0 or 1 holds out none (it has no local test set and is left out of the statistics).
    Stratified: h_k is split over the client's classes by `class_quota` (largest remainder), and class c's
    share drawn without replacement from the client's samples of class c, from the generator keyed by
    (seed, client) alone, so the split does not depend on the ranks, the round, the method or the other
    clients. The runner trains on the first part only (Population sizes and weights count it alone).
    """
    labels = np.asarray(labels)
    train, held = [], []
    for k, part in enumerate(parts):
        part = np.asarray(part, dtype=np.int64)
        n_k = len(part)
        size = min(n_k - 1, max(1, round(fraction * n_k))) if n_k >= 2 else 0
        own = labels[part]
        classes = np.unique(own)
        quota = class_quota(np.array([(own == c).sum() for c in classes]), size)
        rng = np.random.default_rng([seed, _HOLDOUT_STREAM, k])
        drawn = [rng.choice(part[own == c], size=int(m), replace=False) for c, m in zip(classes, quota) if m > 0]
        out = np.sort(np.concatenate(drawn)) if drawn else np.zeros(0, dtype=np.int64)
        held.append(out)
        train.append(part[~np.isin(part, out)])
    return train, held

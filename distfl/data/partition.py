"""Split a dataset's training indices among clients.

`partition` is a pure function of (labels, config, num_classes, seed): every rank computes the same split
without communicating. All randomness comes from one `np.random.RandomState(seed)`, the legacy NumPy RNG
that NIID-Bench (Li et al. 2021, "Federated Learning on Non-IID Data Silos") uses; where a scheme follows
NIID-Bench, the draws are made in the same order as its `partition_data`.
"""
from __future__ import annotations

import numpy as np

from distfl.errors import DataError
from distfl.schema import PartitionConfig


def partition(labels: np.ndarray, cfg: PartitionConfig, num_classes: int, seed: int) -> list[np.ndarray]:
    """One shuffled int64 array of dataset indices per client (len == cfg.num_clients)."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) == 0:
        raise DataError(f"partition needs a non-empty 1-D label array, got shape {labels.shape}")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise DataError(f"labels must lie in 0..{num_classes - 1}, found {labels.min()}..{labels.max()}")
    if cfg.num_clients < 1:
        raise DataError(f"partition.num_clients must be >= 1, got {cfg.num_clients}")
    schemes = {
        "iid": _iid,
        "dirichlet": _dirichlet,
        "n_classes": _n_classes,
        "shards": _shards,
        "quantity": _quantity,
    }
    if cfg.scheme not in schemes:
        raise DataError(f"unknown partition.scheme {cfg.scheme!r}; valid: {', '.join(schemes)}")

    rng = np.random.RandomState(seed)
    parts = schemes[cfg.scheme](labels, cfg, num_classes, rng)

    out = []
    for client, part in enumerate(parts):
        part = np.asarray(part, dtype=np.int64)
        if len(part) == 0:
            raise DataError(
                f"partition scheme {cfg.scheme!r} left client {client} with no samples "
                f"({len(labels)} samples, {cfg.num_clients} clients); use fewer clients or another scheme"
            )
        rng.shuffle(part)  # NIID-Bench shuffles each client's list
        out.append(part)
    return out


def _iid(labels, cfg, num_classes, rng):
    # NIID-Bench "homo".
    return np.array_split(rng.permutation(len(labels)), cfg.num_clients)


def _check_min_size(n, cfg):
    if n < cfg.num_clients * cfg.min_size:
        raise DataError(
            f"{cfg.scheme} partition cannot give {cfg.num_clients} clients min_size={cfg.min_size} samples each "
            f"from {n} samples; lower partition.num_clients or partition.min_size"
        )
    if cfg.alpha <= 0:
        raise DataError(f"partition.alpha must be > 0, got {cfg.alpha}")


def _resampling_failed(cfg):
    return DataError(
        f"{cfg.scheme} partition (alpha={cfg.alpha}, num_clients={cfg.num_clients}) could not give every client "
        f"at least min_size={cfg.min_size} samples in max_attempts={cfg.max_attempts} attempts; raise "
        f"partition.alpha, lower partition.num_clients, or lower partition.min_size"
    )


def _dirichlet_draw(rng, alpha, k):
    """One Dir_k(alpha) draw. For tiny alpha every gamma variate can underflow to 0 and the legacy sampler
    returns NaN; the draw's limit as alpha -> 0 is a uniformly random vertex, so return that instead."""
    q = rng.dirichlet(np.repeat(alpha, k))
    if not np.all(np.isfinite(q)):
        q = np.zeros(k)
        q[rng.randint(k)] = 1.0
    return q


def _dirichlet(labels, cfg, num_classes, rng):
    # NIID-Bench "noniid-labeldir": per class, Dirichlet proportions over clients, with clients already holding
    # N/K samples excluded; the whole split is redrawn until every client has min_size samples.
    n, k = len(labels), cfg.num_clients
    _check_min_size(n, cfg)
    for _ in range(cfg.max_attempts):
        idx_batch = [[] for _ in range(k)]
        for c in range(num_classes):
            idx_c = np.where(labels == c)[0]
            rng.shuffle(idx_c)
            open_ = np.array([len(b) < n / k for b in idx_batch])
            while True:
                # NIID-Bench would divide by zero when all of a draw's mass lands on full clients; redraw.
                q = _dirichlet_draw(rng, cfg.alpha, k) * open_
                if q.sum() > 0:
                    break
            q = q / q.sum()
            cuts = (np.cumsum(q) * len(idx_c)).astype(int)[:-1]
            for b, piece in zip(idx_batch, np.split(idx_c, cuts)):
                b.extend(piece.tolist())
        if min(len(b) for b in idx_batch) >= cfg.min_size:
            return idx_batch
    raise _resampling_failed(cfg)


def _n_classes(labels, cfg, num_classes, rng):
    # NIID-Bench "noniid-#label<C>": client i holds class i % num_classes and C-1 further distinct classes
    # drawn uniformly; each class is split evenly among the clients holding it, in client order.
    k, c_per = cfg.num_clients, cfg.classes_per_client
    if not 1 <= c_per <= num_classes:
        raise DataError(
            f"partition.classes_per_client={c_per} must be between 1 and the number of classes ({num_classes})"
        )
    held = []
    for i in range(k):
        if c_per == num_classes:  # NIID-Bench's special case: every client holds every class, no draws
            held.append(list(range(num_classes)))
            continue
        current = [i % num_classes]
        while len(current) < c_per:
            c = rng.randint(0, num_classes)
            if c not in current:
                current.append(c)
        held.append(current)
    times = [sum(c in h for h in held) for c in range(num_classes)]

    parts = [[] for _ in range(k)]
    for c in range(num_classes):
        idx_c = np.where(labels == c)[0]
        rng.shuffle(idx_c)
        if times[c] == 0:  # only possible with fewer clients than classes: this class is left unused
            continue
        pieces = iter(np.array_split(idx_c, times[c]))
        for i in range(k):
            if c in held[i]:
                parts[i].extend(next(pieces).tolist())
    return parts


def _shards(labels, cfg, num_classes, rng):
    # McMahan et al. 2017: sort by label, cut into equal shards, deal shards_per_client random shards to each.
    k, s = cfg.num_clients, cfg.shards_per_client
    if s < 1:
        raise DataError(f"partition.shards_per_client must be >= 1, got {s}")
    shards = np.array_split(np.argsort(labels, kind="stable"), k * s)
    order = rng.permutation(k * s)
    return [np.concatenate([shards[j] for j in order[i * s:(i + 1) * s]]) for i in range(k)]


def _quantity(labels, cfg, num_classes, rng):
    # NIID-Bench "iid-diff-quantity": iid labels, client sizes ~ Dir(alpha), redrawn until all reach min_size.
    n, k = len(labels), cfg.num_clients
    _check_min_size(n, cfg)
    idx = rng.permutation(n)
    for _ in range(cfg.max_attempts):
        q = _dirichlet_draw(rng, cfg.alpha, k)
        q = q / q.sum()
        if np.min(q * n) >= cfg.min_size:
            cuts = (np.cumsum(q) * n).astype(int)[:-1]
            return np.split(idx, cuts)
    raise _resampling_failed(cfg)


def describe(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> str:
    """A table of the partition: one row per client (size, classes present, class histogram), then a summary.

    With more than 20 classes each row lists only its 5 most frequent classes as `class:count`.
    """
    labels = np.asarray(labels)
    hists = np.stack([np.bincount(labels[p], minlength=num_classes) for p in parts])
    sizes = hists.sum(1)
    present = (hists > 0).sum(1)
    id_w = max(len("client"), len(str(len(parts) - 1)))
    size_w = max(len("size"), len(str(sizes.max())))

    lines = []
    if num_classes <= 20:
        col_w = max(len(str(hists.max())), len(str(num_classes - 1)))
        head = " ".join(f"{c:>{col_w}}" for c in range(num_classes))
        lines.append(f"{'client':>{id_w}} {'size':>{size_w}} classes | {head}")
        for i, h in enumerate(hists):
            row = " ".join(f"{v:>{col_w}}" for v in h)
            lines.append(f"{i:>{id_w}} {sizes[i]:>{size_w}} {present[i]:>7} | {row}")
    else:
        lines.append(f"{'client':>{id_w}} {'size':>{size_w}} classes | top-5 classes (class:count)")
        for i, h in enumerate(hists):
            top = np.argsort(-h, kind="stable")[:5]
            row = "  ".join(f"{c}:{h[c]}" for c in top if h[c] > 0)
            lines.append(f"{i:>{id_w}} {sizes[i]:>{size_w}} {present[i]:>7} | {row}")
    lines.append(
        f"{len(parts)} clients, {sizes.sum()} samples; size min/median/max "
        f"{sizes.min()}/{np.median(sizes):g}/{sizes.max()}; mean classes per client {present.mean():.2f}"
    )
    return "\n".join(lines)

"""Split a dataset's training indices among clients.

`partition` is a pure function of (labels, config, num_classes, seed): every rank computes the same split
without communicating. The randomness comes from one `np.random.RandomState(seed)`, the legacy NumPy RNG
that NIID-Bench (Li et al. 2021, "Federated Learning on Non-IID Data Silos") uses, and, for `n_classes`
only, Python's `random.Random(seed)`, with which NIID-Bench draws each client's classes. Where a scheme
follows NIID-Bench, the draws are made in the same order as its `partition_data` seeded by
`np.random.seed(seed); random.seed(seed)`, so the client sets are NIID-Bench's (tests/integration/test_partition.py
checks them against its client sets on the real Fashion-MNIST labels).
"""
from __future__ import annotations

import os
import random

import numpy as np

from distfl.data.natural import natural_parts
from distfl.data.npz import npz_errors
from distfl.errors import DataError
from distfl.config.schema import PartitionConfig


def partition(labels: np.ndarray | None, cfg: PartitionConfig, num_classes: int, seed: int,
              natural: np.ndarray | None = None) -> list[np.ndarray]:
    """One shuffled int64 array of dataset indices per client (len == cfg.num_clients).

    `natural`: the dataset's client offsets (Dataset.train_offsets), which scheme `natural` follows."""
    if labels is None:  # a next-token dataset: no class a sample, so only its own clients split it
        if cfg.scheme != "natural":
            raise DataError(f"partition.scheme={cfg.scheme} splits samples by their class, but this next-token "
                            "dataset has none; use partition.scheme=natural (its own clients)")
    else:
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
        "longtail": _longtail,
        "file": _from_file,
        "natural": None,
    }
    if cfg.scheme not in schemes:
        raise DataError(f"unknown partition.scheme {cfg.scheme!r}; valid: {', '.join(schemes)}")

    rng = np.random.RandomState(seed)
    if cfg.scheme == "natural":  # int64 ranges already, used as the source orders them; empty clients refused
        parts = natural_parts(natural, cfg.num_clients)
        empty = np.flatnonzero(np.diff(np.asarray(natural)) == 0)
        if len(empty):
            raise DataError(f"the dataset's client {int(empty[0])} has no training sample ({len(empty)} such clients); "
                            "every client of a natural partition needs one: drop them from the source")
        return parts
    if cfg.scheme == "n_classes":
        parts = _n_classes(labels, cfg, num_classes, rng, random.Random(seed))
    else:
        parts = schemes[cfg.scheme](labels, cfg, num_classes, rng)

    out = []
    for client, part in enumerate(parts):
        part = np.asarray(part, dtype=np.int64)
        if len(part) == 0:
            raise DataError(
                f"partition scheme {cfg.scheme!r} left client {client} with no samples "
                f"({len(labels)} samples, {cfg.num_clients} clients); use fewer clients or another scheme"
            )
        if cfg.scheme not in ("file", "natural"):  # a split from a file or the source is used as it is
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


# Redraws before a dirichlet or quantity partition gives up, where partition.max_attempts is 0 (its default).
# quantity at NIID-Bench's 100 clients, alpha 0.5, min_size 10 on 60,000 samples accepts about one Dirichlet
# draw in 70,000 (README "Partitions"); 2,000,000 draws all fail there with probability about e^-28, and
# cost about 12 s of CPU where a setting is impossible. A dirichlet attempt splits every class
# (milliseconds); NIID-Bench's settings need fewer than 10.
DEFAULT_MAX_ATTEMPTS = {"dirichlet": 1000, "quantity": 2_000_000}


def _max_attempts(cfg):
    return cfg.max_attempts or DEFAULT_MAX_ATTEMPTS[cfg.scheme]


def _resampling_failed(cfg):
    default = DEFAULT_MAX_ATTEMPTS[cfg.scheme]
    cap = f"max_attempts={_max_attempts(cfg)}" + (" (the default)" if cfg.max_attempts == 0 else "")
    return DataError(
        f"{cfg.scheme} partition (alpha={cfg.alpha}, num_clients={cfg.num_clients}) could not give every client "
        f"at least min_size={cfg.min_size} samples in {cap} attempts; raise partition.max_attempts "
        f"(0 = this scheme's default, {default}), raise partition.alpha, lower partition.num_clients, or lower "
        f"partition.min_size"
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
    for _ in range(_max_attempts(cfg)):
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


def _n_classes(labels, cfg, num_classes, rng, class_rng):
    # NIID-Bench "noniid-#label<C>": client i holds class i % num_classes and C-1 further distinct classes
    # drawn uniformly; each class is split evenly among the clients holding it, in client order.
    # As in NIID-Bench, the classes are drawn first and with Python's `random` (class_rng), redrawing a class
    # the client already holds; only then does numpy (rng) shuffle each class.
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
            c = class_rng.randint(0, num_classes - 1)  # inclusive bounds, unlike numpy's
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
    q = _first_accepted_draw(rng, cfg.alpha, k, n, cfg.min_size, _max_attempts(cfg))
    if q is None:
        raise _resampling_failed(cfg)
    cuts = (np.cumsum(q) * n).astype(int)[:-1]
    return np.split(idx, cuts)


_BATCH_VALUES = 1 << 17  # Dirichlet variates drawn at once by _first_accepted_draw


def _first_accepted_draw(rng, alpha, k, n, min_size, cap):
    """The first of up to `cap` normalised Dir_k(alpha) draws q with min(q * n) >= min_size, or None.

    The same draws and the same stream as drawing one at a time (NIID-Bench's loop), with rng left just
    after the accepted draw, but about 7x cheaper: the legacy sampler gives the same numbers row by row,
    so draws are made in batches and, once one is accepted, the batch is replayed up to it. A draw whose
    gamma variates all underflow (NaN, tiny alpha) is rejected.
    """
    alphas = np.repeat(alpha, k)
    batch = max(1, _BATCH_VALUES // k)
    drawn = 0
    while drawn < cap:
        state = rng.get_state()
        q = rng.dirichlet(alphas, size=min(batch, cap - drawn))
        q = q / q.sum(axis=1, keepdims=True)
        accepted = np.flatnonzero(np.min(q * n, axis=1) >= min_size)  # NaN compares False
        if len(accepted):
            rng.set_state(state)
            rng.dirichlet(alphas, size=accepted[0] + 1)  # leave rng just after the accepted draw
            return q[accepted[0]]
        drawn += len(q)
    return None


_LONGTAIL_STREAM = 3  # SeedSequence stream of the per-client longtail draws


def _longtail(labels, cfg, num_classes, rng):
    # Cao et al. 2019 exponential long tail per client, as FedFOR (Tian et al. 2022, Sec. 4.2) builds its
    # imbalanced CIFAR-10 clients: "randomly sample 10% training data and further trim the data with a
    # different long tail distribution using an imbalance ratio of 0.01 (~2.5% of the training data)".
    # One draw from the scheme's RandomState(seed) gives a base; client k then uses its own RandomState
    # keyed by (base, k), so each client is a pure, cheap function of (labels, cfg, seed, k) alone.
    base = int(rng.randint(2**31 - 1))
    return [longtail_client(labels, num_classes, cfg.subsample, cfg.imbalance_ratio, base, k)
            for k in range(cfg.num_clients)]


def longtail_client(labels, num_classes, subsample, imbalance_ratio, base_seed, client):
    """One long-tailed client (the `longtail` scheme), from its own RandomState(base_seed, client).

    1. Draw round(subsample * N) of the N training samples uniformly without replacement. Clients draw
       independently, so two clients may share samples (the paper does not say its clients are disjoint).
    2. Pick a random class order (the head class is random per client) and keep, for the class of rank
       r = 0..C-1 (C = classes present in `labels`),
           n_r = floor(n_max * imbalance_ratio ** (r / (C - 1)))
       of that class's drawn samples, where n_max is the *smallest* per-class count in the draw, so every
       class can meet its quota exactly. On balanced CIFAR-10 with subsample 0.1 the draw has ~500 per
       class (min over classes ~470), giving about 500, 299, 179, 107, 64, 38, 23, 13, 8, 5 (1,236 = 2.47%
       at n_max = 500; ~2.3% at the typical n_max), the paper's "~2.5%".
    3. Shuffle.

    Fresh clients every round (the paper's cross-device protocol): set train.cohort=sequential and
    partition.num_clients >= train.rounds * train.clients_per_round; round t then trains clients
    (t-1)*K .. t*K-1, each seen exactly once.
    """
    labels = np.asarray(labels)
    n = len(labels)
    rng = np.random.RandomState(np.random.MT19937(np.random.SeedSequence([base_seed, _LONGTAIL_STREAM, client])))
    m = min(n, max(1, int(round(subsample * n))))
    drawn = rng.choice(n, size=m, replace=False)
    classes = np.flatnonzero(np.bincount(labels, minlength=num_classes))  # classes present at all
    order = classes[rng.permutation(len(classes))]  # order[0] is this client's head class
    drawn_labels = labels[drawn]
    n_max = min(int(np.sum(drawn_labels == c)) for c in classes)
    keep = []
    for r, c in enumerate(order):
        frac = imbalance_ratio ** (r / (len(classes) - 1)) if len(classes) > 1 else 1.0
        quota = int(np.floor(n_max * frac + 1e-9))
        keep.append(drawn[drawn_labels == c][:quota])  # the draw is in random order: a uniform subset
    part = np.concatenate(keep).astype(np.int64)
    rng.shuffle(part)
    return part


def save_partition(parts: list[np.ndarray], path: str) -> None:
    """Write `parts` as an .npz of int64 arrays `client_0` .. `client_<N-1>` (training-set indices, in
    the order `partition` returns them), atomically: a failed write leaves no partial file at `path`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:  # a file object: np.savez adds no suffix
            np.savez(f, **{f"client_{i}": np.asarray(p, dtype=np.int64) for i, p in enumerate(parts)})
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


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


def file_client_count(path: str) -> int:
    """How many clients the partition file at `path` holds (its keys must be client_0 .. client_{N-1})."""
    with npz_errors("partition.path", path), np.load(path, allow_pickle=False) as f:
        keys = set(f.files)
    if not keys or keys != {f"client_{i}" for i in range(len(keys))}:
        listing = ", ".join(sorted(keys)[:5]) + (", ..." if len(keys) > 5 else "")
        raise DataError(f"partition.path {path} must hold arrays named client_0 .. client_{{N-1}} and nothing else "
                        f"(as `distfl partition --out` writes); it holds {len(keys)}: {listing or 'none'}")
    return len(keys)


def _from_file(labels, cfg, num_classes, rng):
    # One int64 index array into the training split per client, e.g. LEAF's writer split or another
    # framework's partition; `distfl partition --out` writes this format.
    file_client_count(cfg.path)
    with npz_errors("partition.path", cfg.path), np.load(cfg.path, allow_pickle=False) as f:
        parts = [f[f"client_{i}"] for i in range(cfg.num_clients)]
    for i, part in enumerate(parts):
        if part.ndim != 1 or not np.issubdtype(part.dtype, np.integer):
            raise DataError(f"partition.path {cfg.path}: client_{i} must be a 1-D integer index array, "
                            f"got shape {part.shape} of {part.dtype}")
        outside = part[(part < 0) | (part >= len(labels))]
        if len(outside):
            raise DataError(f"partition.path {cfg.path}: client_{i} holds index {int(outside[0])}, outside the "
                            f"training set's 0..{len(labels) - 1}")
        if len(part) == 0:
            raise DataError(f"partition.path {cfg.path}: client_{i} holds no index; every client of the file needs a "
                            f"sample: give client_{i} indices, or remove it (renumber the clients after it and set "
                            f"partition.num_clients={cfg.num_clients - 1})")
    _check_disjoint_cover(parts, len(labels), cfg.path)
    return parts


def _check_disjoint_cover(parts, n: int, path: str) -> None:
    """A partition file deals every training sample to exactly one client: an index given twice (in one
    client or two) or a sample left out is refused, naming it."""
    owner = np.full(n, -1, dtype=np.int64)
    for i, part in enumerate(parts):
        unique, counts = np.unique(part, return_counts=True)
        if (counts > 1).any():
            index = int(unique[np.argmax(counts > 1)])
            raise DataError(f"partition.path {path}: client_{i} holds index {index} more than once; a partition "
                            "file deals each training sample to exactly one client, once")
        taken = owner[unique] >= 0
        if taken.any():
            index = int(unique[np.argmax(taken)])
            raise DataError(f"partition.path {path}: index {index} is in both client_{int(owner[index])} and "
                            f"client_{i}; a partition file deals each training sample to exactly one client")
        owner[unique] = i
    missing = np.flatnonzero(owner < 0)
    if len(missing):
        raise DataError(f"partition.path {path}: the clients hold {n - len(missing)} of the {n} training samples "
                        f"({len(missing)} in no client, the first is index {int(missing[0])}); a partition file "
                        "deals every training sample to exactly one client: add the missing indices to clients, "
                        "or drop those samples from the training set (data.path)")

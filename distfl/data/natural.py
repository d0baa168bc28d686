"""Natural federations: datasets whose clients come with the data (FedProx's synthetic devices, LEAF's
users, TFF's client ids), each with its own training and test samples.

A loader returns `Federated`: every client's training samples concatenated in client order, every
client's test samples likewise, and the offsets that cut them, so client k holds training samples
`train_offsets[k]:train_offsets[k + 1]` and test samples `test_offsets[k]:test_offsets[k + 1]`. The
partition `natural` (partition.scheme) gives each client exactly its own training samples, and per-client
evaluation (eval.clients) scores each client on its own test samples.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from distfl.data.tokens import TokenTask
from distfl.errors import ConfigError, DataError
from distfl.data.parts import Parts


@dataclass
class Federated:
    train_x: np.ndarray  # float32, N x ...: every client's training inputs, client after client
    train_y: np.ndarray  # int64 N
    train_offsets: np.ndarray  # int64, clients + 1, from 0 to N, non-decreasing
    test_x: np.ndarray
    test_y: np.ndarray
    test_offsets: np.ndarray  # int64, clients + 1, from 0 to the test samples
    num_classes: int
    name: str
    # the source's names of the clients, in order (a prepared folder's: its memory-mapped unicode array)
    client_ids: Sequence[str] = field(default_factory=list)
    sources: dict[str, tuple] = field(default_factory=dict)  # as Dataset.sources
    tokens: TokenTask | None = None  # a next-token dataset's special tokens (x, y: int64 N x L), as Dataset.tokens
    embeddings: np.ndarray | None = None  # float32 V x D word vectors the token ids index (Sent140's), as Dataset.embeddings
    # TFF's text federations: how they were tokenised, {"sequence_length": L[, "oov_buckets": B]} (kept in a
    # prepared folder's meta.json); None otherwise
    text: dict | None = None

    @property
    def num_clients(self) -> int:
        return len(self.train_offsets) - 1


def concatenate(xs: list[np.ndarray], ys: list[np.ndarray], x_dtype=np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-client arrays -> (inputs, labels, offsets), the inputs as float32 (or `x_dtype`)."""
    offsets = np.zeros(len(xs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(y) for y in ys])
    x = np.concatenate(xs).astype(x_dtype) if xs else np.zeros((0,), x_dtype)
    y = np.concatenate(ys).astype(np.int64) if ys else np.zeros((0,), np.int64)
    return x, y, offsets


# The datasets whose clients come with the data (partition.scheme=natural needs one of them).
NATURAL_DATASETS = ["fedprox_synthetic", "leaf", "tff", "prepared"]
# Their client counts where known before any data loads (the others: once the files are read).
CLIENT_COUNTS = {"fedprox_synthetic": 30}


def check_natural(v: dict) -> None:
    """ConfigError, before any data loads: partition.scheme=natural needs a dataset whose clients come with
    it, and all of them (`v`: the dotted config values). algorithm.weighting=tokens needs a dataset that
    can hold next-token data (data/tokens.py)."""
    if v["algorithm.weighting"] == "tokens" and v["data.dataset"] not in ("tff", "leaf", "prepared"):
        raise ConfigError(f"algorithm.weighting=tokens weighs clients by their target tokens, which only next-token "
                          f"data has (data.dataset=tff with Shakespeare or StackOverflow, leaf with Reddit, or prepared "
                          f"from one), not data.dataset={v['data.dataset']}; use algorithm.weighting=samples")
    for key in ("data.embeddings", "data.vocabulary"):  # LEAF's Sent140, Reddit (data/leaf_text.py)
        if v["data.dataset"] == "leaf" and v[key] and not os.path.isfile(v[key]):
            raise ConfigError(f"{key}: no file at {v[key]}")
    if v["partition.scheme"] != "natural":
        return
    dataset = v["data.dataset"]
    if dataset not in NATURAL_DATASETS:
        raise ConfigError(f"partition.scheme=natural gives each client the samples the dataset assigns it, but "
                          f"data.dataset={dataset} assigns none: use data.dataset in [{', '.join(NATURAL_DATASETS)}] "
                          "or another partition.scheme")
    count = CLIENT_COUNTS.get(dataset)
    if count is not None and v["partition.num_clients"] != count:
        raise ConfigError(f"data.dataset={dataset} has {count} devices but partition.num_clients="
                          f"{v['partition.num_clients']}; set partition.num_clients={count} for its natural partition")


def natural_parts(train_offsets: np.ndarray | None, num_clients: int) -> Parts:
    """partition.scheme=natural: client k's training indices, its own samples in the source's order."""
    if train_offsets is None:
        raise DataError(f"partition.scheme=natural needs a dataset whose clients come with the data "
                        f"(data.dataset: {', '.join(NATURAL_DATASETS)}); pick another partition.scheme")
    count = len(train_offsets) - 1
    if count != num_clients:
        raise DataError(f"the dataset holds {count} clients but partition.num_clients={num_clients}; "
                        f"set partition.num_clients={count} for its natural partition")
    return Parts.ranges(train_offsets)


def natural_test_sets(test_offsets: np.ndarray) -> Parts:
    """Each client's own test samples (indices into the test split), for eval.clients."""
    if int(np.asarray(test_offsets)[-1]) == 0:
        raise DataError("eval.clients=true scores each client on its own test samples, but no client of this natural "
                        "split has any (a user-wise split: its test users are not training clients); set "
                        "eval.clients=false, or eval.client_split=holdout to hold out part of each client's training "
                        "samples")
    return Parts.ranges(test_offsets)

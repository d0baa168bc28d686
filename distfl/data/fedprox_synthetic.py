"""FedProx's synthetic federations: Synthetic(alpha, beta) and Synthetic-IID (Li et al., "Federated
Optimization in Heterogeneous Networks", MLSys 2020, Section 5.1), drawn as the authors' generators
(their repository's data/synthetic_*/generate_synthetic.py and data/synthetic_iid/generate_iid.py) draw them.

30 devices, 60 features, 10 classes. With one `np.random.RandomState(seed)` standing in for the scripts'
global NumPy state and one `random.Random(seed)` for their global `random`, the draws, in order, are:

  n_k = floor(lognormal(4, 2)) + 50 for the 30 devices (a heavy, power-law-like tail of sizes);
  Synthetic(alpha, beta):
    u_k ~ N(0, alpha) per device (the mean of its model: W_k and b_k both), B_k ~ N(0, beta) per device;
    v_k ~ N(B_k, 1) in each of the 60 features (device k's feature mean), for all k first;
    then per device k: W_k ~ N(u_k, 1) (60 x 10), b_k ~ N(u_k, 1) (10), x ~ N(v_k, Sigma) n_k times,
    Sigma = diag(j^-1.2), j = 1..60, drawn by `multivariate_normal`;
  Synthetic-IID (generate_iid.py): one W ~ N(0, 1), b ~ N(0, 1) for all devices, x ~ N(0, Sigma) per device;
  y = argmax(softmax(x W + b)) for each sample (softmax as the scripts compute it, overflow included);
  then per device, in order, `random.shuffle` of its samples and the first int(0.9 n_k) as its training
  split, the rest as its test split (the scripts' 90/10 per-user split).

So `generate(alpha, beta, iid, seed)` equals the authors' script run after `np.random.seed(seed);
random.seed(seed)` (their scripts seed neither, so each of their runs drew a different federation).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from distfl.data.natural import CLIENT_COUNTS, Federated, concatenate

NUM_DEVICES = CLIENT_COUNTS["fedprox_synthetic"]
DIMENSION = 60
NUM_CLASSES = 10
TRAIN_FRACTION = 0.9


@dataclass
class Federation:
    """The generated devices: features (float64, as drawn), labels, and what was drawn to make them."""
    x: list[np.ndarray]  # per device: n_k x 60, in the shuffled order (train first, then test)
    y: list[np.ndarray]  # per device: n_k int64 labels
    train_sizes: np.ndarray  # int(0.9 n_k) per device
    sizes: np.ndarray  # n_k per device
    model_means: np.ndarray  # u_k (zeros for IID)
    feature_shift: np.ndarray  # B_k (zeros for IID)
    feature_means: np.ndarray  # 30 x 60: v_k (zeros for IID)


def _labels(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmax(softmax(x W + b)) per row, as the scripts compute it: exp, then divide by the row's sum. An
    overflowing exp makes the row NaN and argmax then picks the first NaN, as theirs does."""
    with np.errstate(over="ignore", invalid="ignore"):
        ex = np.exp(x @ w + b)
        return np.argmax(ex / ex.sum(axis=1, keepdims=True), axis=1).astype(np.int64)


def generate(alpha: float, beta: float, iid: bool, seed: int) -> Federation:
    rng = np.random.RandomState(seed)
    sizes = rng.lognormal(4, 2, NUM_DEVICES).astype(int) + 50
    cov = np.diag(np.power(np.arange(1, DIMENSION + 1), -1.2))
    xs, ys = [], []
    if iid:
        model_means = np.zeros(NUM_DEVICES)
        shift = np.zeros(NUM_DEVICES)
        feature_means = np.zeros((NUM_DEVICES, DIMENSION))
        w = rng.normal(0, 1, (DIMENSION, NUM_CLASSES))
        b = rng.normal(0, 1, NUM_CLASSES)
        for k in range(NUM_DEVICES):
            x = rng.multivariate_normal(feature_means[k], cov, sizes[k])
            xs.append(x)
            ys.append(_labels(x, w, b))
    else:
        model_means = rng.normal(0, alpha, NUM_DEVICES)
        shift = rng.normal(0, beta, NUM_DEVICES)
        feature_means = np.stack([rng.normal(shift[k], 1, DIMENSION) for k in range(NUM_DEVICES)])
        for k in range(NUM_DEVICES):
            w = rng.normal(model_means[k], 1, (DIMENSION, NUM_CLASSES))
            b = rng.normal(model_means[k], 1, NUM_CLASSES)
            x = rng.multivariate_normal(feature_means[k], cov, sizes[k])
            xs.append(x)
            ys.append(_labels(x, w, b))
    shuffler = random.Random(seed)
    train_sizes = np.zeros(NUM_DEVICES, dtype=np.int64)
    for k in range(NUM_DEVICES):
        order = list(range(int(sizes[k])))
        shuffler.shuffle(order)  # the draws of random.shuffle depend on the length alone
        xs[k], ys[k] = xs[k][order], ys[k][order]
        train_sizes[k] = int(TRAIN_FRACTION * int(sizes[k]))
    return Federation(xs, ys, train_sizes, sizes.astype(np.int64), model_means, shift, feature_means)


def load_fedprox_synthetic(alpha: float, beta: float, iid: bool, seed: int) -> Federated:
    """The generated federation as a natural one: device k's first int(0.9 n_k) shuffled samples are its
    training split, the rest its test split; inputs are 1 x 1 x 60 (float32), as vector data are here."""
    fed = generate(alpha, beta, iid, seed)
    cut = fed.train_sizes
    train_x, train_y, train_offsets = concatenate([x[:t] for x, t in zip(fed.x, cut)], [y[:t] for y, t in zip(fed.y, cut)])
    test_x, test_y, test_offsets = concatenate([x[t:] for x, t in zip(fed.x, cut)], [y[t:] for y, t in zip(fed.y, cut)])
    name = "synthetic_iid" if iid else f"synthetic({alpha:g},{beta:g})"
    return Federated(train_x.reshape(-1, 1, 1, DIMENSION), train_y, train_offsets,
                     test_x.reshape(-1, 1, 1, DIMENSION), test_y, test_offsets, NUM_CLASSES, name,
                     client_ids=[f"f_{k:05d}" for k in range(NUM_DEVICES)])

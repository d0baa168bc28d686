"""eval.test_samples, eval.train_samples: the global model scored on a fixed sample of a split instead of
all of it (TFF's StackOverflow baseline scores 10,000 test sentences of 16.6 M; FedProx's training loss
over a population of millions of samples likewise).

The sample is drawn once from the data seed (partition.seed, or the run's seed), not from the round:
rows = sorted(numpy.random.default_rng([data seed, stream]).choice(split size, N, replace=False)), stream 7
for the test split and 8 for the training split. Every rank draws the same rows, every evaluation scores
the same rows, and a resumed run draws them again from the same seed, so 1 rank, N ranks and a resumed
run report the same values. N = 0, or N at least the split's size, scores the whole split. Only the
global model's test_* and global_train_* metrics use the sample: per-client evaluation (eval.clients)
scores each client's own test samples, as before.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_TEST_STREAM = 7  # beside population.py's (1, 2, 3), client_test.py's (3, 4), client_eval.py's (5), ccvr.py's (6)
_TRAIN_STREAM = 8


def sample_rows(size: int, wanted: int, seed: int, stream: int) -> np.ndarray | None:
    """The sorted rows of a split of `size` samples that an evaluation scores; None: all of them."""
    if wanted <= 0 or wanted >= size:
        return None
    rng = np.random.default_rng([seed, stream])
    return np.sort(rng.choice(size, wanted, replace=False)).astype(np.int64)


@dataclass
class EvalSample:
    """The rows of the test split (and of the training split, with eval.train_metrics) that an evaluation
    scores; None for a whole split."""

    test: np.ndarray | None
    train: np.ndarray | None
    test_size: int
    train_size: int
    train_metrics: bool

    @staticmethod
    def of(cfg_eval, data, seed: int) -> "EvalSample":
        test_size, train_size = len(data.test_y), len(data.train_y)
        train = sample_rows(train_size, cfg_eval.train_samples, seed, _TRAIN_STREAM) if cfg_eval.train_metrics else None
        return EvalSample(sample_rows(test_size, cfg_eval.test_samples, seed, _TEST_STREAM), train, test_size,
                          train_size, cfg_eval.train_metrics)

    def split(self, prefix: str, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The scored part of a split (`prefix` "" for test, "train_" for training): its sampled rows, in order."""
        rows = self.test if prefix == "" else self.train
        if rows is None:
            return x, y
        index = torch.from_numpy(rows).to(y.device)
        return x[index], y[index]

    def describe(self) -> str:
        """'' when every split is scored whole, else what is scored (the start line's end)."""
        parts = [f"{len(rows)} of the {size} {name} samples" for rows, size, name in (
            (self.test, self.test_size, "test"), (self.train, self.train_size, "training")) if rows is not None]
        return f"; evaluations score a fixed sample: {' and '.join(parts)}" if parts else ""

    def to_json(self) -> dict:
        """summary.json's eval_samples: each split's scored samples and its size (train: None without
        eval.train_metrics)."""
        def entry(rows, size):
            return {"scored": size if rows is None else len(rows), "of": size}

        return {"test": entry(self.test, self.test_size),
                "train": entry(self.train, self.train_size) if self.train_metrics else None}

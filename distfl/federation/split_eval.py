"""The global model scored on whole splits: the test split always, and with eval.train_metrics the whole
training split too (FedProx's "training loss": the global model's loss over every client's training
samples, so weighted by samples). Each rank scores every world_size-th batch; the counts and the
fixed-point loss sums travel in the evaluation's one all_reduce, so the result is the same on any
number of ranks."""
from __future__ import annotations

import math

from .aggregate import LOSS_BOUND, Segment

# segment prefix -> metric prefix
_NAMES = {"": "test_", "train_": "global_train_"}


def eval_splits(data, train_metrics: bool) -> list[tuple[str, object, object]]:
    """(segment prefix, inputs, labels) of each split scored."""
    splits = [("", data.test_x, data.test_y)]
    if train_metrics:
        splits.append(("train_", data.train_x, data.train_y))
    return splits


def split_segments(splits, batch: int) -> tuple[list[Segment], int]:
    """The segments of the splits' loss sums and correct counts, and the most batch terms one sum adds."""
    segments = [seg for prefix, _, _ in splits for seg in (
        Segment(f"{prefix}loss_sum", 1, bound=LOSS_BOUND * batch), Segment(f"{prefix}correct", 1, kind="int"))]
    return segments, max(-(-len(y) // batch) for _, _, y in splits)


def add_split_counts(model, stats, splits, batch: int, ctx) -> None:
    for prefix, x, y in splits:
        for start in range(ctx.rank * batch, len(y), ctx.world_size * batch):
            logits = model(x[start:start + batch])
            stats.add(f"{prefix}correct", (logits.argmax(1) == y[start:start + batch]).sum())
            stats.add(f"{prefix}loss_sum", model.loss(logits, y[start:start + batch], reduction="sum"))


def split_metrics(reduced, splits) -> dict:
    """test_acc, test_loss (and global_train_acc, global_train_loss) from the reduced buffer."""
    metrics = {}
    for prefix, _, y in splits:
        loss = math.nan if reduced.problems() else reduced.scalar(f"{prefix}loss_sum") / len(y)
        metrics[f"{_NAMES[prefix]}acc"] = int(reduced[f"{prefix}correct"][0]) / len(y)
        metrics[f"{_NAMES[prefix]}loss"] = loss
    return metrics

"""The global model scored on whole splits (or the fixed sample of eval.test_samples, eval.train_samples:
eval_sample.py): the test split always, and with eval.train_metrics the training split too (FedProx's
"training loss": the global model's loss over every client's training samples, so weighted by samples).
Each rank scores every world_size-th batch; the counts and the
fixed-point loss sums travel in the evaluation's one all_reduce, so the result is the same on any
number of ranks. A next-token dataset (data/tokens.py) is scored per token: its loss and accuracy are
divided by the split's token counts, not by its sequences."""
from __future__ import annotations

import math

import torch

from ..data.tokens import batch_scores, token_counts
from .aggregate import LOSS_BOUND, Segment, StatBuffer
from .client_eval import add_client_counts, client_segments, clients_never_sampled, reduced_client_statistics

# segment prefix -> metric prefix
_NAMES = {"": "test_", "train_": "global_train_"}


@torch.no_grad()
def evaluate(context, clients: bool) -> dict:
    """test_acc and test_loss of the global model (or the model the method evaluates) on the whole test
    set, sharded by batch, and (`clients`) the statistics of per-client accuracy (client_eval.py), in one
    all_reduce. `context`: the run's RunContext (federation/run_state.py)."""
    cfg, worker = context.cfg, context.worker
    worker.load(*context.algorithm.evaluation_model(context.global_params, context.global_buffers))
    model = worker.module
    model.eval()
    splits = eval_splits(context.data, cfg.eval.train_metrics, context.eval_sample)
    segments, terms = split_segments(splits, cfg.eval.batch_size)
    stats = StatBuffer(segments + (client_segments(len(context.population)) if clients else []), context.device, terms)
    add_split_counts(model, stats, splits, cfg.eval.batch_size, context.ctx)
    if clients:
        add_client_counts(context, stats)
    reduced = stats.reduce(context.ctx, name="eval")
    metrics = split_metrics(reduced, splits)
    if clients:
        metrics.update(reduced_client_statistics(reduced, context), clients_never_sampled=clients_never_sampled(context))
    return metrics


def eval_splits(data, train_metrics: bool, sample) -> list[tuple[str, object, object, object]]:
    """(segment prefix, inputs, labels, the dataset's TokenTask or None) of each split scored: its rows
    that `sample` (eval_sample.EvalSample) keeps, all of them by default."""
    tokens = getattr(data, "tokens", None)
    splits = [("", *sample.split("", data.test_x, data.test_y), tokens)]
    if train_metrics:
        splits.append(("train_", *sample.split("train_", data.train_x, data.train_y), tokens))
    return splits


def split_segments(splits, batch: int) -> tuple[list[Segment], int]:
    """The segments of the splits' loss sums and correct counts, and the most batch terms one sum adds.
    A batch's loss sum adds a term per sample, or per token of a next-token dataset."""
    segments = [seg for prefix, _, y, _ in splits for seg in (
        Segment(f"{prefix}loss_sum", 1, bound=LOSS_BOUND * batch * _positions(y)),
        Segment(f"{prefix}correct", 1, kind="int"))]
    return segments, max(-(-len(y) // batch) for _, _, y, _ in splits)


def _positions(y) -> int:
    return int(y.shape[1]) if y.dim() > 1 else 1


def add_split_counts(model, stats, splits, batch: int, ctx) -> None:
    for prefix, x, y, tokens in splits:
        for start in range(ctx.rank * batch, len(y), ctx.world_size * batch):
            loss_sum, correct = batch_scores(model, model(x[start:start + batch]), y[start:start + batch], tokens)
            stats.add(f"{prefix}correct", correct)
            stats.add(f"{prefix}loss_sum", loss_sum)


def split_metrics(reduced, splits) -> dict:
    """test_acc, test_loss (and global_train_acc, global_train_loss) from the reduced buffer."""
    metrics = {}
    for prefix, _, y, tokens in splits:
        loss_count, acc_count = token_counts(y, tokens)
        loss = math.nan if reduced.problems() or not loss_count else reduced.scalar(f"{prefix}loss_sum") / loss_count
        metrics[f"{_NAMES[prefix]}acc"] = int(reduced[f"{prefix}correct"][0]) / acc_count if acc_count else math.nan
        metrics[f"{_NAMES[prefix]}loss"] = loss
    return metrics

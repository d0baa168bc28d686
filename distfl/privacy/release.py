"""What a private run releases beside its models, and what it withholds (docs/privacy.md lists every
output, item by item).

Withheld from metrics.jsonl, the trackers (TensorBoard, MLflow, W&B), the progress line and summary.json:
  - the round's exact aggregates of the sampled clients (their mean train loss, their sample count:
    mechanism.WITHHELD);
  - wall-clock timings (per-round `round_s`, the cumulative `wall_s` of each row and of summary.json, the
    progress line's seconds a round and eta): a round takes longer the more clients it trains and the
    more samples they hold, so its time counts a Poisson cohort's size, which the accountant's
    amplification by sampling assumes hidden, and moves with one client's data. `privacy.release_timings:
    true` logs them, for timing studies, outside the guarantee.
Divergence messages name no count of clients.

Marked, not withheld: in a natural federation whose clients own test samples (LEAF's sample split, TFF,
FedProx's synthetic devices) the test split is made of the clients' own samples, so test_acc, test_loss
and what is computed from them are not post-processing of the model alone. The start line warns, the
final line says so and summary.json's `privacy.test_metrics_covered` is false.
"""
from __future__ import annotations

from .mechanism import WITHHELD as CLIENT_AGGREGATES

TIMINGS = ("round_s", "wall_s")


def timings_released(cfg) -> bool:
    """Whether the run logs its wall-clock times: every non-private run; a private one that opts in."""
    return cfg.privacy.mechanism == "none" or cfg.privacy.release_timings


def withheld(cfg) -> tuple[str, ...]:
    """The round metrics a run with this config does not log (none without DP)."""
    if cfg.privacy.mechanism == "none":
        return ()
    return CLIENT_AGGREGATES + (() if timings_released(cfg) else TIMINGS)


def test_metrics_covered(cfg, data) -> bool:
    """Whether the test metrics are computed from the model and data no client owns: False when the clients
    of a natural federation hold test samples of their own (the test split is theirs)."""
    offsets = data.test_offsets
    return not (cfg.partition.scheme == "natural" and offsets is not None and int(offsets[-1]) > 0)


TEST_SPLIT_WARNING = ("warning: the test split holds the clients' own test samples (partition.scheme=natural), so "
                      "test_acc, test_loss and the accuracies computed from them are not covered by the guarantee "
                      "(summary.json: privacy.test_metrics_covered false); release the model, not them, where "
                      "the clients' test data must stay private")

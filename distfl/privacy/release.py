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

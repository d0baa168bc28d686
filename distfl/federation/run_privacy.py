"""How a run wires differential privacy (privacy.*; docs/privacy.md): the noise multiplier, before any
work; the mechanism that draws the cohorts and the ledger that counts epsilon; the lines a private run
starts with; the round metrics it withholds. (The cohort itself is drawn in round.py's `select`.)"""
from __future__ import annotations

from ..privacy import release, rules as dp_rules


def noise_multiplier(cfg) -> float | None:
    """privacy.target_epsilon: the noise multiplier the accountant calibrates (None: no central noise)."""
    return None if cfg.privacy.mechanism in ("none", *dp_rules.DISTRIBUTED) else accountant().resolve_noise_multiplier(cfg)


def check_model(cfg, worker) -> None:
    """A private run refuses a model whose buffers (BatchNorm statistics) DP cannot clip."""
    if cfg.privacy.mechanism != "none":
        dp_rules.check_model_buffers(worker.buffers.numel(), cfg.model.name)


def mechanism_and_ledger(cfg, algorithm, noise_multiplier: float | None, num_clients: int, progress):
    """(the Gaussian mechanism or None, the ledger of epsilon or None). `progress()`: the run's progress
    dict, which distributed DP's ledger reads when it counts."""
    if cfg.privacy.mechanism in dp_rules.DISTRIBUTED:  # the clients noise (secagg/aggregator.py)
        from ..secagg.aggregator import DistributedLedger

        return None, DistributedLedger(cfg, algorithm.segments(), progress)
    if cfg.privacy.mechanism != "none":
        return algorithm.mechanism, accountant().Ledger.of(cfg, noise_multiplier, num_clients)
    return None, None


def start_lines(cfg, data, noise_multiplier: float | None, privacy, ledger=None) -> list[str]:
    """What a private run says first: central DP's guarantee and whether the test metrics are covered;
    distributed DP's ledger (secagg/aggregator.py) its calibration."""
    if privacy is None:
        return [ledger.describe()] if ledger is not None else []
    lines = [accountant().describe(cfg, noise_multiplier, privacy.update_multiplier)]
    if not release.test_metrics_covered(cfg, data):
        lines.append(release.TEST_SPLIT_WARNING)
    return lines


def withhold(cfg, metrics: dict) -> None:
    """Drop from a round's `metrics` what it does not release (DP: no un-noised client statistic, no timing)."""
    for key in ("samples", *release.withheld(cfg)):
        metrics.pop(key, None)


def accountant():
    """dp-accounting (and the scipy it pulls in) loads only for a private run: about 0.8 s of every
    other run's start."""
    from ..privacy import accountant

    return accountant

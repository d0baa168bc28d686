"""DP-FedAvg's Gaussian mechanism around a method (`privacy.mechanism: gaussian`; the maths in
privacy/mechanism.py, the rules of which methods may run under it in privacy/rules.py):
  - every client's weight is 1 / the expected cohort size (the paper's fixed denominator), whoever
    else was sampled;
  - what the method's client_statistics adds to its released segments is clipped jointly, per client;
  - the server step reads the round's sums with the mechanism's noise on them (keyed by (seed, round):
    the same on every rank), and the clip adapts.
The run keeps the mechanism (its state is checkpointed beside its secret noise key, federation/run_state.py's
PrivacyState) and the accountant's ledger. Distributed DP (ddgauss, skellam) is not this feature: its
clients noise their own updates under secure aggregation (secagg/aggregator.py).
"""
from __future__ import annotations

from ..federation.aggregate import Segment
from ..privacy import rules
from .feature import Feature


class Private(Feature):
    feature_name = "dp"
    keys = ("privacy.*",)
    order = 40  # outermost: what it clips is everything the features inside it add
    private = True

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.privacy.mechanism not in ("none", *rules.DISTRIBUTED)

    @classmethod
    def refuse(cls, v: dict, method: type) -> None:
        rules.check(v, method)

    def __init__(self, inner, cfg, setting):
        super().__init__(inner, cfg, setting)
        from ..privacy.mechanism import GaussianMechanism

        mechanism = GaussianMechanism(cfg, inner.segments(), setting.noise_multiplier, setting.device, setting.ctx)
        self._own(mechanism=mechanism, round_idx=0)

    def begin_round(self, round_idx: int) -> None:
        self.round_idx = round_idx
        self.inner.begin_round(round_idx)

    def client_weight(self, client_id: int, cohort: list[int]) -> float:
        return self.mechanism.weight()

    def added_segments(self) -> list[Segment]:
        return self.mechanism.segments()

    def client_statistics(self, run, worker, stats) -> None:
        self.mechanism.collect(self.inner, run, worker, stats)

    def transform_reduced(self, reduced):
        return self.mechanism.privatize(reduced, self.round_idx)

    @property
    def round_metrics(self) -> dict:
        return {**self.inner.round_metrics, **self.mechanism.metrics}

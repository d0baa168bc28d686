"""DP-FedAvg's Gaussian mechanism around a method (`privacy.mechanism: gaussian`; the maths in
privacy/mechanism.py, the rules of which methods may run under it in privacy/rules.py):
  - every client's weight is 1 / the expected cohort size (the paper's fixed denominator), whoever
    else was sampled;
  - what the method's client_statistics adds to its released segments is clipped jointly, per client;
  - the server step reads the round's sums with the mechanism's noise on them (keyed by (seed, round):
    the same on every rank), and the clip adapts.
The run keeps the mechanism (its state is checkpointed) and the accountant's ledger.
"""
from __future__ import annotations

import torch

from ..federation.aggregate import Segment
from .wrapper import Wrapper


class Private(Wrapper):
    def __init__(self, inner, mechanism):
        super().__init__(inner)
        self._own(mechanism=mechanism, round_idx=0)

    def begin_round(self, round_idx: int) -> None:
        self.round_idx = round_idx
        self.inner.begin_round(round_idx)

    def client_weight(self, client_id: int, cohort: list[int]) -> float:
        return self.mechanism.weight()

    def segments(self) -> list[Segment]:
        return self.inner.segments() + self.mechanism.segments()

    def client_statistics(self, run, worker, stats) -> None:
        self.mechanism.collect(self.inner, run, worker, stats)

    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        self.inner.server_update(params, buffers, self.mechanism.privatize(reduced, self.round_idx))

    @property
    def round_metrics(self) -> dict:
        return {**self.inner.round_metrics, **self.mechanism.metrics}

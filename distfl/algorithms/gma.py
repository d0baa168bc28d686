"""Gradient Masked Averaging (Tenison et al., TMLR), Eq. 3 and Algorithm 1: a soft mask on the
aggregated update from the clients' sign agreement. An aggregation option for any algorithm
(`aggregation.mask: gma`), reduced in the round's one all_reduce as an integer sum of signs.

  A_j = | (1/|C|) sum_{n in C} sign(Delta^n_j) |      (unweighted, over the round's sampled clients C)
  mask_j = 1 if A_j >= tau else A_j
  w <- w + lr * mask (.) Delta          (Delta: the weighted mean update, Alg. 1)

Choices where the paper is silent or inconsistent (docs/algorithms/gma.md):
  - sign(0) = 0: a client whose coordinate did not move counts for neither sign, but still counts in |C|.
  - A_j >= tau is decided on integers, |sum sign| >= tau * |C| (with 1e-9 slack), so 7/3 at tau 0.4 is 1.
  - with an adaptive server optimizer the mask multiplies the optimizer's final step by default
    (`aggregation.mask_applies_to: step`); `update` masks Delta before the moments instead.
"""
from __future__ import annotations

import torch

from ..errors import ConfigError
from ..federation.aggregate import Segment
from .feature import Feature


class GMA(Feature):
    """Any method with GMA's mask on its server optimizer's step: each client's update (what the method
    adds to "delta") also adds its signs to "sign_sum"; the server optimizer's step is masked by the
    round's agreement (a method whose server step does not use the server optimizer is left as it is)."""

    feature_name = "gma"
    keys = ("aggregation.mask", "aggregation.tau", "aggregation.mask_applies_to")
    order = 10  # innermost: the signs are the method's own update's

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.aggregation.mask == "gma"

    @classmethod
    def refuse(cls, v: dict, method: type) -> None:
        name = v["algorithm.name"]
        if not getattr(method, "aggregates", True):
            raise ConfigError(f"algorithm.name={name} aggregates nothing (each client keeps its whole model), so "
                              "aggregation.mask=gma has nothing to act on: set aggregation.mask=none")
        if getattr(method, "own_server_step", False):
            raise ConfigError(f"algorithm.name={name} has its own server step and does not apply aggregation.mask=gma; "
                              "set aggregation.mask=none")
        if v["privacy.mechanism"] != "none":
            raise ConfigError(f"privacy.mechanism={v['privacy.mechanism']}: aggregation.mask=gma releases the "
                              "per-coordinate sign counts of the clients' updates unnoised; set aggregation.mask=none")
        if v["system.async_mode"] != "none":
            raise ConfigError(f"system.async_mode={v['system.async_mode']} sums weighted updates only: aggregation.mask=gma "
                              "is not defined for it; set aggregation.mask=none")

    def __init__(self, inner, cfg, setting):
        super().__init__(inner, cfg, setting)
        self._own(tau=cfg.aggregation.tau, gma_metrics={})
        inner.server_opt = MaskedStep(inner.server_opt, self, cfg.aggregation.mask_applies_to)

    def added_segments(self) -> list[Segment]:
        # Not payload (wire_bytes 0): the server takes each update's signs from the update it receives.
        return [Segment("sign_sum", self.num_params, kind="int", wire_bytes=0)]

    def client_statistics(self, run, worker, stats) -> None:
        self.inner.client_statistics(run, worker, _WithSigns(stats))

    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        self.gma_metrics.clear()
        self.server_opt.reduced = reduced
        try:
            self.inner.server_update(params, buffers, reduced)
        finally:
            self.server_opt.reduced = None

    def mask(self, reduced) -> torch.Tensor:
        """The round's soft mask; records its statistics."""
        mask, stats = agreement_mask(reduced["sign_sum"], int(reduced["clients"][0]), self.tau)
        self.gma_metrics.update(stats)
        return mask

    @property
    def round_metrics(self) -> dict:
        return {**self.inner.round_metrics, **self.gma_metrics}


class MaskedStep:
    """The method's server optimizer, its step masked by GMA (fedopt.ServerOptimizer.step's `mask`)."""

    def __init__(self, opt, gma: GMA, applies_to: str):
        self.opt, self.gma, self.applies_to, self.reduced = opt, gma, applies_to, None

    def step(self, params: torch.Tensor, update: torch.Tensor) -> None:
        mask = self.gma.mask(self.reduced) if self.reduced is not None else None
        self.opt.step(params, update, mask, self.applies_to)

    @property
    def lr(self) -> float:
        return self.opt.lr

    @lr.setter
    def lr(self, value: float) -> None:
        self.opt.lr = value

    def state_dict(self) -> dict:
        return self.opt.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.opt.load_state_dict(state)


class _WithSigns:
    """The round's statistics, as a method adds to them, with the signs of its "delta" beside it."""

    def __init__(self, stats):
        self._stats = stats

    def add(self, name: str, value, weight: float = 1.0) -> None:
        self._stats.add(name, value, weight)
        if name == "delta":
            self._stats.add("sign_sum", torch.sign(value))

    def __getattr__(self, name: str):
        return getattr(self._stats, name)


def agreement_mask(sign_sum: torch.Tensor, num_clients: int, tau: float) -> tuple[torch.Tensor, dict]:
    """The soft mask from the summed signs, and the per-round statistics logged to TensorBoard."""
    magnitude = sign_sum.abs()
    agree = magnitude.double() >= tau * num_clients - 1e-9
    agreement = magnitude.double() / num_clients
    mask = torch.where(agree, torch.ones_like(agreement), agreement).to(torch.float32)
    stats = {
        "gma/frac_below_tau": 1.0 - float(agree.double().mean()),
        "gma/mean_mask": float(mask.double().mean()),
        "gma/frac_zero_agreement": float((magnitude == 0).double().mean()),
    }
    return mask, stats

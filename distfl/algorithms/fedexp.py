"""FedExP (Jhunjhunwala, Wang, Joshi, ICLR 2023): FedAvg with a server step size extrapolated from the
clients' updates, and evaluation on the mean of the last two global models.

Round t, cohort S (M = |S| clients), client update Delta_i = w_i - w^t, aggregation weight p_i (sum 1):

    Delta_bar = sum_i p_i Delta_i                                           the "delta" segment
    eta_g     = max(1, sum_i p_i ||Delta_i||^2 / (2 (||Delta_bar||^2 + eps)))
    w^{t+1}   = w^t + eta_g Delta_bar                                       (through the server optimizer)
    evaluated: (w^{t+1} + w^t) / 2    (w^1 alone after the first round)

With p_i = 1/M (algorithm.weighting=uniform) eta_g is the paper's max(1, sum_i ||Delta_i||^2 / (2M
(||Delta_bar||^2 + eps))); with sample weights (the default, and the released code's) both sums use p_i.
sum_i p_i ||Delta_i||^2 is one more value of the round's exact fixed-point sum (segment "sq_norm"),
so eta_g is bit-identical on any number of ranks. docs/algorithms/fedexp.md.
"""
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError
from ..federation.aggregate import Segment
from .base import Algorithm
from .feature import kept_params


def extrapolated_step_size(sq_norm_mean: float, mean_update_sq_norm: float, eps: float) -> float:
    """max(1, sum_i p_i ||Delta_i||^2 / (2 (||sum_i p_i Delta_i||^2 + eps)))."""
    return max(1.0, sq_norm_mean / (2.0 * (mean_update_sq_norm + eps)))


class FedExP(Algorithm):
    name = "fedexp"

    @dataclass
    class Options:
        eps: float = field(default=1.0e-3, metadata={"range": "> 0"})  # epsilon of the server step size max(1, sum_i p_i ||Delta_i||^2 / (2 (||sum_i p_i Delta_i||^2 + eps))) (the authors' code: 1e-3 for CIFAR-10/100 and CINIC-10, 0.1 for EMNIST)

    @classmethod
    def check_config(cls, cfg):
        if cfg.server.optimizer != "sgd":
            raise ConfigError(
                f"algorithm.name=fedexp scales the averaged update by its step size eta_g, which "
                f"server.optimizer={cfg.server.optimizer} divides out again (it normalises the update by its "
                "own second moments); use server.optimizer=sgd (with server.momentum and server.lr if wanted)")
        if cfg.calibration.method != "none":
            raise ConfigError(
                f"algorithm.name=fedexp evaluates the mean of the last two global models, but calibration."
                f"method={cfg.calibration.method} calibrates the last one only after training; set "
                "calibration.method=none")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.eps = float(self.options.eps)
        # The coordinates a feature keeps on the clients (FedBN's BatchNorm: the server's is the mean of the
        # clients' own, never a step) are left out of eta_g; known once the method is wrapped (`_shared`).
        self.shared = False
        self.previous_params = self.layout.params.detach().clone()  # w^t, before this round's step
        self.previous_buffers = self.layout.buffers.detach().clone()
        self.steps = 0  # server steps taken (the first one's iterate is evaluated alone)

    def _shared(self, vector: torch.Tensor) -> torch.Tensor:
        if self.shared is False:
            kept = kept_params(self.outer)
            self.shared = None if kept is None else ~kept
        return vector if self.shared is None else vector[self.shared]

    def segments(self):
        return super().segments() + [Segment("sq_norm", 1)]

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        delta = self._shared(worker.params - run.global_params).to(torch.float64)
        stats.add("sq_norm", torch.dot(delta, delta), run.weight)

    def server_direction(self, params, reduced):
        mean_update = reduced["delta"]  # float64
        shared = self._shared(mean_update)
        eta = extrapolated_step_size(reduced.scalar("sq_norm"), float(torch.dot(shared, shared)), self.eps)
        self.round_metrics["fedexp_eta_g"] = eta
        return (mean_update * eta).to(params.dtype)

    def server_update(self, params, buffers, reduced):
        self.previous_params.copy_(params)
        self.previous_buffers.copy_(buffers)
        super().server_update(params, buffers, reduced)
        self.steps += 1

    def evaluation_model(self, params, buffers):
        if self.steps < 2:
            return params, buffers
        return (params + self.previous_params) / 2, (buffers + self.previous_buffers) / 2

    def server_state(self):
        return {**super().server_state(), "previous_params": self.previous_params.clone(),
                "previous_buffers": self.previous_buffers.clone(), "steps": torch.tensor(self.steps)}

    def load_server_state(self, state):
        super().load_server_state(state)
        self.previous_params.copy_(state["previous_params"])
        self.previous_buffers.copy_(state["previous_buffers"])
        self.steps = int(state["steps"])

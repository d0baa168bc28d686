"""FedDyn (Acar et al. 2021), Algorithm 1.

Client k minimises  L_k(w) - <grad_k, w> + alpha/2 ||w - w_global||^2, so its gradient gets
  - grad_k + alpha (w - w_global);   afterwards grad_k <- grad_k - alpha (w_k - w_global).
Server:  h <- h - alpha (1/N) sum_{k in cohort} (w_k - w_global)      (N = all clients)
         w <- mean_k w_k - h / alpha
The mean follows `algorithm.weighting` (the paper's is uniform; set weighting=uniform to match it);
the resulting direction (mean delta - h/alpha) goes through the server optimizer (sgd, lr 1 = paper).
"""
from dataclasses import dataclass, field

import torch

from ..federation.aggregate import Segment
from ..config.values import check_derived
from .base import Algorithm


class FedDyn(Algorithm):
    name = "feddyn"
    tct_stage1 = True
    stateful = True
    why_not_private = ("FedDyn releases each client's update a second time, weighted 1/num_clients (delta_over_n), "
                       "so one client moves two sums and the clip bounds neither as the accountant assumes")

    @dataclass
    class Options:
        alpha: float = field(default=0.01, metadata={"range": "> 0"})  # dynamic regulariser weight

    @classmethod
    def check_config(cls, cfg):
        alpha = cfg.algorithm.options["alpha"]
        check_derived("1 / alpha (FedDyn's server step)", {"algorithm.options.alpha": alpha}, lambda: 1 / alpha)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.alpha = self.options.alpha
        self.h = torch.zeros(self.num_params, device=self.device)

    def init_client_state(self):
        return {"grad": torch.zeros(self.num_params, device=self.device)}

    def correct_gradient(self, w, g, run):
        g.sub_(run.state["grad"]).add_(w - run.global_params, alpha=self.alpha)

    def segments(self):
        return super().segments() + [Segment("delta_over_n", self.num_params)]

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        delta = worker.params - run.global_params
        stats.add("delta_over_n", delta, 1.0 / len(self.population))
        run.state["grad"] = run.state["grad"] - self.alpha * delta

    def server_direction(self, params, reduced):
        self.h.sub_(reduced["delta_over_n"].to(self.h.dtype), alpha=self.alpha)
        return reduced["delta"].to(params.dtype) - self.h / self.alpha

    def server_state(self):
        return {**super().server_state(), "h": self.h.clone()}

    def load_server_state(self, state):
        super().load_server_state(state)
        self.h.copy_(state["h"])

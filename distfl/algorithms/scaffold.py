"""SCAFFOLD (Karimireddy et al. 2020), Algorithm 1 with option II for the client control variate.

Local step:   y <- y - lr (g + c - c_i)
After K steps: c_i+ = c_i - c + (x - y) / (K lr)
Server:       x <- x + lr_g * mean_k (y_k - x)  (the server optimizer on the weighted mean delta)
              c <- c + (1/N) sum_k (c_i+ - c_i)  (N = all clients, |S|/N * mean over the cohort)

Where c - c_i acts (`algorithm.scaffold_correction`; docs/algorithms/scaffold.md):
  gradient  added to each step's gradient, as Algorithm 1 writes the step: local momentum and weight
            decay, when configured, act on the corrected gradient;
  weights   NIID-Bench's code (`train_net_scaffold`): the optimizer steps on the plain loss gradient,
            then y <- y - lr (c - c_i), outside momentum and weight decay.
The two are the same step without momentum and weight decay.
"""
from dataclasses import dataclass, field

import torch

from ..federation.aggregate import Segment
from ..federation.schedule import round_lr
from .base import Algorithm


class Scaffold(Algorithm):
    name = "scaffold"
    tct_stage1 = True
    stateful = True
    why_not_private = "SCAFFOLD releases each client's control-variate update (c_i+ - c_i) unclipped and unnoised beside its model update"

    @dataclass
    class Options:
        correction: str = field(default="gradient", metadata={"choices": ["gradient", "weights"]})  # where c - c_i acts. gradient (Algorithm 1: added to every local step's gradient, so train.momentum and train.weight_decay act on it) | weights (NIID-Bench's code: the optimizer steps on the loss gradient, then w <- w - lr (c - c_i) after every step, outside momentum and weight decay). The same without momentum and weight decay (docs/algorithms/scaffold.md)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.c = torch.zeros(self.num_params, device=self.device)
        self.on_weights = self.options.correction == "weights"

    def init_client_state(self):
        return {"c": torch.zeros(self.num_params, device=self.device)}

    def correct_gradient(self, w, g, run):
        if not self.on_weights:
            g.add_(self.c).sub_(run.state["c"])

    def after_step(self, w, lr, run):
        if self.on_weights:
            # As NIID-Bench writes it, w - lr * (c - c_i): the product rounded before the subtraction.
            w.sub_(torch.sub(self.c, run.state["c"]).mul_(lr))

    def segments(self):
        return super().segments() + [Segment("control_delta", self.num_params)]

    def download_segments(self):  # the server's control variate c goes out with the model (the paper's (x, c))
        return super().download_segments() + [Segment("c", self.num_params)]

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        c_i = run.state["c"]
        lr = round_lr(self.cfg.train, run.round_idx, self.cfg.train.rounds)
        c_new = c_i - self.c + (run.global_params - worker.params) / (run.steps * lr)
        stats.add("control_delta", c_new - c_i, 1.0 / len(self.population))
        run.state["c"] = c_new

    def server_update(self, params, buffers, reduced):
        super().server_update(params, buffers, reduced)
        self.c.add_(reduced["control_delta"].to(self.c.dtype))

    def server_state(self):
        return {**super().server_state(), "c": self.c.clone()}

    def load_server_state(self, state):
        super().load_server_state(state)
        self.c.copy_(state["c"])

"""Server optimizers (FedOpt, Reddi et al. 2021, Algorithm 2), applied to the averaged client update.

`update` is the pseudo-gradient Delta_t = mean_k (w_k - w), a direction to ADD to the model:
  sgd:     m = momentum * m + Delta (if momentum > 0, FedAvgM);     w += lr * m   (or lr * Delta)
  adam:    m = b1 m + (1-b1) Delta;  v = b2 v + (1-b2) Delta^2;                   w += lr * m / (sqrt(v) + eps)
  yogi:    m as adam;                v = v - (1-b2) Delta^2 sign(v - Delta^2);     w += lr * m / (sqrt(v) + eps)
  adagrad: m as adam;                v = v + Delta^2;                             w += lr * m / (sqrt(v) + eps)
As in the paper: no bias correction, v starts at eps^2 (the paper's v_{-1} >= tau^2), m at 0.
FedAvg is sgd with lr 1 and momentum 0, which adds Delta exactly.
"""
from __future__ import annotations

import torch


class ServerOptimizer:
    def __init__(self, cfg, numel: int, device: torch.device):
        self.cfg = cfg
        self.kind = cfg.optimizer
        self.state: dict[str, torch.Tensor] = {}
        if self.kind == "sgd" and cfg.momentum > 0:
            self.state["m"] = torch.zeros(numel, device=device)
        if self.kind in ("adam", "yogi", "adagrad"):
            self.state["m"] = torch.zeros(numel, device=device)
            self.state["v"] = torch.full((numel,), cfg.eps**2, device=device)

    def step(self, params: torch.Tensor, update: torch.Tensor) -> None:
        cfg = self.cfg
        if self.kind == "sgd":
            if "m" in self.state:
                update = self.state["m"].mul_(cfg.momentum).add_(update)
            params.add_(update, alpha=cfg.lr)
            return
        m, v = self.state["m"], self.state["v"]
        m.mul_(cfg.beta1).add_(update, alpha=1 - cfg.beta1)
        square = update * update
        if self.kind == "adam":
            v.mul_(cfg.beta2).add_(square, alpha=1 - cfg.beta2)
        elif self.kind == "yogi":
            v.sub_(torch.sign(v - square) * square, alpha=1 - cfg.beta2)
        else:  # adagrad
            v.add_(square)
        params.addcdiv_(m, v.sqrt().add_(cfg.eps), value=cfg.lr)

    def state_dict(self) -> dict:
        return {k: t.clone() for k, t in self.state.items()}

    def load_state_dict(self, state: dict) -> None:
        for k, t in state.items():
            self.state[k].copy_(t)


def build_server_optimizer(cfg, numel: int, device: torch.device) -> ServerOptimizer:
    return ServerOptimizer(cfg, numel, device)

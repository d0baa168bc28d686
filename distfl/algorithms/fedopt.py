"""Server optimizers (FedOpt, Reddi et al. 2021, Algorithm 2), applied to the averaged client update.

`update` is the pseudo-gradient Delta_t = mean_k (w_k - w), a direction to ADD to the model:
  sgd:     m = momentum * m + Delta (if momentum > 0, FedAvgM);     step = m   (or Delta)
  adam:    m = b1 m + (1-b1) Delta;  v = b2 v + (1-b2) Delta^2;                   step = m / (sqrt(v) + eps)
  yogi:    m as adam;                v = v - (1-b2) Delta^2 sign(v - Delta^2);     step = m / (sqrt(v) + eps)
  adagrad: m as adam;                v = v + Delta^2;                             step = m / (sqrt(v) + eps)
  w += lr * step          (lr: server.lr at this round, under server.lr_schedule)
As in the paper: no bias correction, v starts at eps^2 (the paper's v_{-1} >= tau^2), m at 0.
FedAvg is sgd with lr 1 and momentum 0, which adds Delta exactly.

A mask (GMA) multiplies either the final step (`mask_applies_to: step`, the literal reading of GMA's
Algorithm 2: moments see the unmasked update) or the update before the moments (`update`).
For plain sgd without momentum both are the same.
"""
from __future__ import annotations

import torch


class ServerOptimizer:
    def __init__(self, cfg, numel: int, device: torch.device):
        self.cfg = cfg
        self.kind = cfg.optimizer
        self.lr = float(cfg.lr)  # this round's server lr; the runner sets it from server.lr_schedule
        self.state: dict[str, torch.Tensor] = {}
        if self.kind == "sgd" and cfg.momentum > 0:
            self.state["m"] = torch.zeros(numel, device=device)
        if self.kind in ("adam", "yogi", "adagrad"):
            self.state["m"] = torch.zeros(numel, device=device)
            self.state["v"] = torch.full((numel,), cfg.eps**2, device=device)

    def _direction(self, update: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        if self.kind == "sgd":
            return self.state["m"].mul_(cfg.momentum).add_(update) if "m" in self.state else update
        m, v = self.state["m"], self.state["v"]
        m.mul_(cfg.beta1).add_(update, alpha=1 - cfg.beta1)
        square = update * update
        if self.kind == "adam":
            v.mul_(cfg.beta2).add_(square, alpha=1 - cfg.beta2)
        elif self.kind == "yogi":
            v.sub_(torch.sign(v - square) * square, alpha=1 - cfg.beta2)
        else:  # adagrad
            v.add_(square)
        return m / (v.sqrt() + cfg.eps)

    def step(self, params: torch.Tensor, update: torch.Tensor, mask: torch.Tensor | None = None,
             mask_applies_to: str = "step") -> None:
        if mask is not None and mask_applies_to == "update":
            update = update * mask
        direction = self._direction(update)
        if mask is not None and mask_applies_to == "step":
            direction = direction * mask
        params.add_(direction, alpha=self.lr)

    def state_dict(self) -> dict:
        return {k: t.clone() for k, t in self.state.items()}

    def load_state_dict(self, state: dict) -> None:
        for k, t in state.items():
            self.state[k].copy_(t)


def build_server_optimizer(cfg, numel: int, device: torch.device) -> ServerOptimizer:
    return ServerOptimizer(cfg, numel, device)

"""The algorithm interface: hooks into the runtime's round, never a round loop of its own.

A round, as the runtime runs it (federation/runner.py):
  for each client this rank hosts:      load global model -> local SGD (local_loss, correct_gradient)
                                        -> client_statistics(run, worker, stats)
  stats.reduce()                        one all_reduce of every segment, summed over the cohort
  server_update(reduced)                identical on every rank

`FedAvg`-style defaults live here: the weighted model delta and the BatchNorm buffers are summed, and
the server optimizer (FedOpt) is applied to the averaged delta. A method overrides only what differs.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..federation.aggregate import Segment
from .fedopt import build_server_optimizer


class Algorithm:
    name = "base"
    stateful = False  # True: keeps per-client state between rounds (client state store)

    def __init__(self, cfg, population, num_params: int, num_buffers: int, device: torch.device):
        self.cfg = cfg
        self.seed = cfg.seed
        self.population = population
        self.num_params = num_params
        self.num_buffers = num_buffers
        self.device = device
        self.server_opt = build_server_optimizer(cfg.server, num_params, device)

    # ---- weights -------------------------------------------------------------------------------
    def client_weight(self, client_id: int, cohort: list[int]) -> float:
        """Aggregation weight of a client in this round's cohort; weights sum to 1."""
        if self.cfg.algorithm.weighting == "uniform":
            return 1.0 / len(cohort)
        sizes = self.population.sizes
        return float(sizes[client_id]) / float(sum(int(sizes[c]) for c in cohort))

    # ---- client side ---------------------------------------------------------------------------
    def init_client_state(self) -> dict:
        """State a client starts with the first time it is sampled (stateful methods)."""
        return {}

    def local_loss(self, logits: torch.Tensor, y: torch.Tensor, run) -> torch.Tensor:
        return F.cross_entropy(logits, y)

    def correct_gradient(self, w: torch.Tensor, g: torch.Tensor, run) -> None:
        """Add method-specific terms to the flat gradient `g` in place, before weight decay and momentum."""

    def segments(self) -> list[Segment]:
        return [Segment("delta", self.num_params), Segment("buffers", self.num_buffers)]

    def client_statistics(self, run, worker, stats) -> None:
        """Add this client's contributions to the round's sums (after its local training)."""
        stats.add("delta", worker.params - run.global_params, run.weight)
        stats.add("buffers", worker.buffers, run.weight)

    # ---- server side ---------------------------------------------------------------------------
    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        """Update the global model in place from the reduced sums."""
        self.server_opt.step(params, self.server_direction(params, reduced))
        buffers.copy_(reduced["buffers"])

    def server_direction(self, params: torch.Tensor, reduced) -> torch.Tensor:
        """The pseudo-gradient handed to the server optimizer: for FedAvg the weighted mean delta."""
        return reduced["delta"].to(params.dtype)

    def server_state(self) -> dict:
        """Everything the server keeps between rounds (checkpointed)."""
        return {"server_opt": self.server_opt.state_dict()}

    def load_server_state(self, state: dict) -> None:
        self.server_opt.load_state_dict(state["server_opt"])

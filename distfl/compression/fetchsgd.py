"""FetchSGD's server (Rothchild, Panda, Ullah, Ivkin, Stoica, Braverman, Gonzalez & Arora, "FetchSGD:
communication-efficient federated learning with sketching", ICML 2020, Algorithm 1).

Each client sends S(x_i), the count sketch (sketch.py) of its update; the sketch is linear, so the exact
weighted sum of the clients' sketches is the sketch of their weighted mean update, S. The server keeps
two sketches, momentum S_u and error S_e, and in round t with server lr eta_t and momentum rho:

    S_u <- rho S_u + S                 (momentum, in sketch space)
    S_e <- S_e + eta_t S_u             (error accumulation, in sketch space)
    Delta = Top-k(U(S_e))              (the k largest of the unsketched estimates)
    S_e <- S_e - S(Delta)              (what was applied leaves the error)
    w <- w + Delta

(the paper writes w - Delta for gradients; a client's update here points the way the model moves).
U reads coordinate i as the median over rows of s_j(i) S_e[j, h_j(i)]. Both sketches are float64 and
server state (checkpointed), and the hashes are one set per run, keyed by the seed alone: the momentum
and error sketches add sketches of different rounds, which only share a space if they share hashes.
"""
from __future__ import annotations

import math

import torch

from .base import keyed_generator
from .sketch import CountSketch

_KEY = 0xF37C4  # keeps the sketch's hashes apart from every other keyed stream of the run


def kept(density: float, numel: int) -> int:
    """k = ceil(density x d), at least 1, at most d: the coordinates the server applies a round."""
    return max(1, min(numel, math.ceil(density * numel)))


class FetchSGDServer:
    def __init__(self, numel: int, rows: int, columns: int, k: int, seed: int, device: torch.device | str = "cpu"):
        self.sketch = CountSketch(numel, rows, columns, keyed_generator(seed, _KEY), device)
        self.k = k
        self.momentum = torch.zeros(rows, columns, dtype=torch.float64, device=device)
        self.error = torch.zeros(rows, columns, dtype=torch.float64, device=device)

    @property
    def size(self) -> int:
        """Values in one sketch (rows x columns): what a client sends."""
        return self.sketch.rows * self.sketch.columns

    def client_sketch(self, update: torch.Tensor) -> torch.Tensor:
        """What a client sends for `update`: its sketch, flat (float64)."""
        return self.sketch.sketch(update.reshape(-1)).reshape(-1)

    def step(self, summed: torch.Tensor, lr: float, rho: float) -> torch.Tensor:
        """One round of Algorithm 1 from the summed sketch `summed` (the sketch of the weighted mean update):
        Delta (float64, the model's shape flat), to be added to the model."""
        self.momentum.mul_(rho).add_(summed.reshape(self.momentum.shape).to(self.momentum.device))
        self.error.add_(self.momentum, alpha=lr)
        delta = self.sketch.unsketch(self.error, self.k)
        self.error.sub_(self.sketch.sketch(delta))
        return delta

    def state_dict(self) -> dict:
        return {"momentum": self.momentum.clone(), "error": self.error.clone()}

    def load_state_dict(self, state: dict) -> None:
        self.momentum.copy_(state["momentum"])
        self.error.copy_(state["error"])

"""Adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with
Adaptive Clipping", NeurIPS 2021, Algorithm 1 with geometric updates).

Each sampled client also reports whether its update fitted within this round's clip C_t,
b_i = 1[||Delta_i|| <= C_t]. distfl adds b_i - 1/2 into the exact sum (a sensitivity of 1/2 under
adding or removing a client), the server adds N(0, sigma_b^2) and divides by the expected cohort
size m:  b_t = (sum_i (b_i - 1/2) + N(0, sigma_b^2)) / m + 1/2 (the paper's b~ with the count centred),
then  C_{t+1} = C_t * exp(-eta_C (b_t - gamma)):  the clip shrinks while more than a fraction gamma of
the clients fit within it, and grows otherwise.

Noise split (Thm 1): the update's sum gets noise z_Delta * C_t with
  z_Delta = (z^-2 - (2 sigma_b)^-2)^(-1/2),
so the two Gaussian releases of a round together are one Gaussian mechanism of noise multiplier z,
the value the accountant is given. sigma_b defaults to m / 20, the paper's choice.
"""
from __future__ import annotations

import math

import torch


def count_noise_std(count_noise_multiplier: float, clients_per_round: int) -> float:
    return count_noise_multiplier if count_noise_multiplier > 0 else clients_per_round / 20.0


def update_noise_multiplier(noise_multiplier: float, count_std: float) -> float:
    """z_Delta of Thm 1, such that z_Delta and 2 sigma_b compose to z; needs 2 sigma_b > z."""
    if noise_multiplier == 0:
        return 0.0
    rest = noise_multiplier ** -2 - (2 * count_std) ** -2
    if rest <= 0:
        return math.inf
    return rest ** -0.5


class AdaptiveClip:
    """The clip norm C_t of round t: server state, the same on every rank, checkpointed."""

    def __init__(self, clip_norm: float, target_quantile: float, lr: float, count_std: float, denominator: int):
        self.clip_norm = float(clip_norm)
        self.target_quantile, self.lr = target_quantile, lr
        self.count_std, self.denominator = count_std, denominator

    def indicator(self, norm: float) -> float:
        """A client's centred report b_i - 1/2."""
        return (1.0 if norm <= self.clip_norm else 0.0) - 0.5

    def update(self, centred_sum: torch.Tensor, noise: torch.Tensor) -> float:
        """Move C from the summed reports and a standard normal draw; returns the noised fraction b_t."""
        fraction = float((centred_sum + self.count_std * noise) / self.denominator) + 0.5
        self.clip_norm *= math.exp(-self.lr * (fraction - self.target_quantile))
        return fraction

    def state_dict(self) -> dict:
        return {"clip_norm": self.clip_norm}

    def load_state_dict(self, state: dict) -> None:
        self.clip_norm = float(state["clip_norm"])

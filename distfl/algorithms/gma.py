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

"""Conditional randomised rounding (Kairouz, Liu & Steinke, "The distributed discrete Gaussian mechanism
for federated learning with secure aggregation", ICML 2021, Section 4.1): each coordinate of the scaled
vector x rounds up with probability equal to its fractional part (unbiased), and the whole rounding is
drawn again until the rounded vector's norm is at most

    min( ||x|| + sqrt(d),  sqrt( ||x||^2 + d/4 + sqrt(2 log(1/beta)) (||x|| + sqrt(d)/2) ) )

(the paper's bound; beta = 0 keeps only the first, which always holds), so the sensitivity the
accountant uses is never exceeded. With beta > 0 one draw passes with probability at least 1 - beta."""
from __future__ import annotations

import math

import torch

MAX_ROUNDING_DRAWS = 1000


def rounded_norm_bound(norm: float, beta: float, dim: int) -> float:
    """The L2 bound on the rounded vector for an input of L2 norm `norm` (0 <= beta < 1)."""
    if not 0 <= beta < 1:
        raise ValueError(f"conditional rounding: beta must be in [0, 1), got {beta}")
    first = norm + math.sqrt(dim)
    if beta == 0:
        return first
    second = norm**2 + 0.25 * dim + math.sqrt(2 * math.log(1 / beta)) * (norm + 0.5 * math.sqrt(dim))
    return min(first, math.sqrt(second))


def conditional_round(x: torch.Tensor, beta: float, generator: torch.Generator) -> torch.Tensor:
    """x (float) randomly rounded to int64 within `rounded_norm_bound`; redraws at most MAX_ROUNDING_DRAWS
    times (with beta = e^-0.5, the paper's setting, a draw passes with probability >= 0.39)."""
    wide = x.to(torch.float64)
    bound = rounded_norm_bound(float(torch.linalg.vector_norm(wide)), beta, wide.numel())
    low = torch.floor(wide)
    for _ in range(MAX_ROUNDING_DRAWS):
        rounded = low + (torch.rand(wide.shape, generator=generator, dtype=torch.float64) < wide - low).to(torch.float64)
        if float(torch.linalg.vector_norm(rounded)) <= bound:
            return rounded.to(torch.int64)
    raise RuntimeError(f"conditional rounding: no draw within the norm bound {bound:.6g} in {MAX_ROUNDING_DRAWS} "
                       f"draws (beta={beta})")

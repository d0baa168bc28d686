"""Modular arithmetic of secure aggregation. A value travels as an integer in the range
[lower, upper) of width m = upper - lower (m = 2^b for b-bit secure aggregation, lower = -2^(b-1)):
anything outside wraps, x -> ((x - lower) mod m) + lower, and so does the sum, which is therefore the
same whatever the order of its terms. This is the modular clipping of Kairouz, Liu & Steinke (ICML 2021)
and of TFF's ModularClippingSumFactory."""
from __future__ import annotations

import torch


def modular_clip(x: torch.Tensor, lower: int, upper: int) -> torch.Tensor:
    """x (integers) wrapped into [lower, upper)."""
    if not lower < upper:
        raise ValueError(f"modular range: lower ({lower}) must be below upper ({upper})")
    width = upper - lower
    return torch.remainder(x.to(torch.int64) - lower, width) + lower


def modular_sum(terms, lower: int, upper: int) -> torch.Tensor:
    """The sum of integer tensors modulo the range, each term wrapped first (as a client sends it)."""
    total = None
    for term in terms:
        wrapped = modular_clip(term, lower, upper)
        total = wrapped if total is None else modular_clip(total + wrapped, lower, upper)
    return total


def wraps(x: torch.Tensor, lower: int, upper: int) -> int:
    """How many coordinates of an integer sum fall outside [lower, upper), i.e. would wrap."""
    return int(((x < lower) | (x >= upper)).sum())

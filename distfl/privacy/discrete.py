"""Integer noise for distributed DP: each client adds its own share, in integers, before secure
aggregation, so the server only ever sees the noisy sum.

- `discrete_gaussian`: N_Z(0, sigma^2), P(x) proportional to exp(-x^2 / (2 sigma^2)) on the integers
  (Canonne, Kamath & Steinke, "The discrete Gaussian for differential privacy", NeurIPS 2020,
  Algorithm 3): draw Y from the discrete Laplace with scale t = floor(sigma) + 1 and accept it with
  probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)); rejected coordinates draw again. The discrete
  Laplace is drawn as the difference of two geometric variables with success probability 1 - e^(-1/t),
  each by inversion (floor(-t log U), U uniform in (0, 1]). The paper's Algorithm 1 makes every Bernoulli
  exact in rational arithmetic; here they are computed in float64, as TensorFlow Privacy's sampler
  does, which is what a vectorised sampler over millions of coordinates can afford. The tests compare
  the counts with the exact probability mass function.
- `skellam`: Poisson(mu) - Poisson(mu), variance 2 mu (Agarwal, Kairouz & Liu, "The Skellam mechanism
  for differentially private federated learning", NeurIPS 2021); the sum of n clients' shares is
  Skellam(n mu), which is what its accounting uses.

Every draw comes from the generator given (keyed by the run's secret, round and client), so the noise
is the same on any rank and after a resume.
"""
from __future__ import annotations

import math

import torch

MAX_REJECTION_PASSES = 10_000


def _uniform_open_closed(shape, generator: torch.Generator) -> torch.Tensor:
    """Uniforms in (0, 1] in float64 (1 - U for U in [0, 1)), so that log never sees 0."""
    return 1.0 - torch.rand(shape, generator=generator, dtype=torch.float64)


def discrete_laplace(shape, scale: int, generator: torch.Generator) -> torch.Tensor:
    """P(y) proportional to exp(-|y| / scale) on the integers, as int64."""
    def geometric():
        return torch.floor(-scale * torch.log(_uniform_open_closed(shape, generator))).to(torch.int64)
    return geometric() - geometric()


def discrete_gaussian(shape, sigma: float, generator: torch.Generator) -> torch.Tensor:
    """N_Z(0, sigma^2) as int64 of the given shape (sigma > 0)."""
    if not sigma > 0 or not math.isfinite(sigma):
        raise ValueError(f"discrete Gaussian: sigma must be positive and finite, got {sigma}")
    shape = tuple(shape) if not isinstance(shape, int) else (shape,)
    numel = math.prod(shape)
    out = torch.empty(numel, dtype=torch.int64)
    pending = torch.arange(numel)
    t = math.floor(sigma) + 1
    for _ in range(MAX_REJECTION_PASSES):
        if pending.numel() == 0:
            return out.view(shape)
        y = discrete_laplace((pending.numel(),), t, generator)
        accept = torch.rand(pending.numel(), generator=generator, dtype=torch.float64) < torch.exp(
            -(y.abs().to(torch.float64) - sigma**2 / t) ** 2 / (2 * sigma**2))
        out[pending[accept]] = y[accept]
        pending = pending[~accept]
    raise RuntimeError(f"discrete Gaussian: {pending.numel()} coordinates still rejected after "
                       f"{MAX_REJECTION_PASSES} passes (sigma={sigma})")


def skellam(shape, mu: float, generator: torch.Generator) -> torch.Tensor:
    """Skellam(mu): the difference of two Poisson(mu) draws, as int64 (mu > 0)."""
    if not mu > 0 or not math.isfinite(mu):
        raise ValueError(f"Skellam: mu must be positive and finite, got {mu}")
    rates = torch.full(tuple(shape) if not isinstance(shape, int) else (shape,), float(mu), dtype=torch.float64)
    return (torch.poisson(rates, generator=generator) - torch.poisson(rates, generator=generator)).to(torch.int64)

"""Privacy of distributed DP: the clients' integer noise shares summed under secure aggregation.

Both mechanisms are accounted in Renyi DP at the integer orders 2..128 and 256, composed over rounds,
amplified by Poisson sampling where clients are sampled, and turned into (epsilon, delta) by
dp-accounting's conversion (Canonne, Kamath & Steinke 2020, Proposition 12 / Asoodeh et al. 2020).

Sensitivities. A client's update is clipped to L2 norm c, scaled by s (the integer grid's resolution) and
conditionally rounded with bound beta (secagg/rounding.py), so in grid units its L2 sensitivity is
D2 = rounded_norm_bound(c s, beta, d) and its L1 sensitivity D1 = D2 min(sqrt(d), D2) (on integers,
L1 <= L2^2). Below, D2 and D1 are in the model's units (divided by s) where the paper states them so.

- Distributed discrete Gaussian (Kairouz, Liu & Steinke, ICML 2021): n clients each add N_Z(0, sigma_s^2)
  in grid units (sigma_s = sigma s). The sum is not a discrete Gaussian; Theorem 1 bounds its distance
  by tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma_s^2 k / (k + 1)), and Proposition 14 gives, with the central
  sigma_c = sqrt(n) sigma_s and scales e2 = D2 / sigma_c, e1 = D1 / sigma_c (both in grid units),
      RDP(a) = min( a e2^2 / 2 + tau d,  a (e2^2 + 2 e1 tau + tau^2 d) / 2,  a (e2 + sqrt(d) tau)^2 / 2 ).
- Skellam (Agarwal, Kairouz & Liu, NeurIPS 2021, Theorem 3.5 with its sum over clients): the sum of n
  Skellam shares is Skellam with central variance mu (model units, at scale s); with D2, D1 in model units
      RDP(a) = a D2^2 / (2 mu) + min( ((2a - 1) s D2^2 + 6 D1) / (4 s^3 mu^2),  3 D1 / (2 s mu) ).
- Poisson sampling with rate q < 1: Zhu & Wang (ICML 2019), Theorem 5's upper bound for any RDP curve,
  and the smaller of it and the unsampled curve at each order.

Only clients that survive (report) add noise that the server's sum contains, so `num_clients` is the
number of survivors, never the number selected.

`calibrate` finds the smallest noise multiplier whose epsilon, by the same functions, stays within a target
(privacy.target_epsilon): a bisection on the noise's logarithm.
"""
from __future__ import annotations

import math

import numpy as np
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon
from scipy import special

from ..secagg.rounding import rounded_norm_bound

RDP_ORDERS = tuple(range(2, 129)) + (256,)


def _log_binomial(n: int, k: int) -> float:
    return special.gammaln(n + 1) - special.gammaln(k + 1) - special.gammaln(n - k + 1)


def poisson_subsampled_rdp(order: int, q: float, rdp) -> float:
    """Zhu & Wang 2019, Theorem 5: RDP at integer `order` of a mechanism with RDP curve `rdp` (a function
    of the order) applied to a Poisson sample with rate q."""
    a = order
    terms = [0.0, rdp(2)]
    weights = [(1 - q) ** (a - 1) * (a * q - q + 1), special.comb(a, 2) * q**2 * (1 - q) ** (a - 2)]
    for j in range(3, a + 1):
        terms.append((j - 1) * rdp(j) + _log_binomial(a, j) + (a - j) * math.log1p(-q) + j * math.log(q))
        weights.append(3.0)
    return float(special.logsumexp(terms, b=weights)) / (a - 1)


def _sampled_curve(rdp, q: float, steps: int, orders) -> np.ndarray:
    if q == 1:
        return np.array([rdp(a) for a in orders]) * steps
    return np.array([min(poisson_subsampled_rdp(a, q, rdp), rdp(a)) for a in orders]) * steps


def _sensitivities(l2_clip: float, scale: float, beta: float, dim: int) -> tuple[float, float]:
    """(D2, D1) in grid units after scaling by `scale` and conditional rounding."""
    d2 = rounded_norm_bound(l2_clip * scale, beta, dim)
    return d2, d2 * min(math.sqrt(dim), d2)


def ddgauss_tau(local_sigma_grid: float, num_clients: int) -> float:
    """Theorem 1's tau for n clients' discrete Gaussian shares of stddev `local_sigma_grid` (grid units)."""
    return 10 * sum(math.exp(-2 * (math.pi * local_sigma_grid) ** 2 * k / (k + 1)) for k in range(1, num_clients))


def ddgauss_epsilon(*, scale: float, local_sigma: float, num_clients: int, l2_clip: float, beta: float, dim: int,
                    q: float, steps: int, delta: float, orders=RDP_ORDERS) -> float:
    """Epsilon of `steps` rounds of the distributed discrete Gaussian; `local_sigma` is each client's noise
    stddev in model units (grid units: local_sigma * scale), `dim` the padded dimension."""
    d2, d1 = _sensitivities(l2_clip, scale, beta, dim)
    tau = ddgauss_tau(local_sigma * scale, num_clients)
    central = math.sqrt(num_clients) * local_sigma * scale
    e2, e1 = d2 / central, d1 / central

    def rdp(a):
        return min(a * e2**2 / 2 + tau * dim, a * (e2**2 + 2 * e1 * tau + tau**2 * dim) / 2,
                   a * (e2 + math.sqrt(dim) * tau) ** 2 / 2)

    return compute_epsilon(list(orders), _sampled_curve(rdp, q, steps, orders), delta)[0]


def skellam_epsilon(*, scale: float, central_sigma: float, l2_clip: float, beta: float, dim: int, q: float,
                    steps: int, delta: float, orders=RDP_ORDERS) -> float:
    """Epsilon of `steps` rounds of the distributed Skellam mechanism; `central_sigma` is the stddev of the
    summed noise in model units (sqrt(n) times each client's)."""
    d2, d1 = (v / scale for v in _sensitivities(l2_clip, scale, beta, dim))
    mu, s = central_sigma**2, scale

    def rdp(a):
        return a * d2**2 / (2 * mu) + min(((2 * a - 1) * s * d2**2 + 6 * d1) / (4 * s**3 * mu**2),
                                          3 * d1 / (2 * s * mu))

    return compute_epsilon(list(orders), _sampled_curve(rdp, q, steps, orders), delta)[0]


def calibrate(epsilon_of, target_epsilon: float, *, tol: float = 1e-4, bracket=(1e-3, 1e4)) -> float:
    """The smallest noise multiplier z in `bracket`, to `tol` relative, with epsilon_of(z) <= target_epsilon;
    `epsilon_of` decreases in z. The z returned meets the target and z (1 - tol) does not (unless z is the
    bracket's lower end, which already meets it). ValueError, naming the epsilon spent, if the bracket's
    upper end does not meet it."""
    lower, upper = bracket
    spent = epsilon_of(upper)
    if not spent <= target_epsilon:
        raise ValueError(f"even noise_multiplier={upper:g} spends epsilon {spent:.4g}")
    if epsilon_of(lower) <= target_epsilon:
        return lower
    # epsilon_of(lower) > target >= epsilon_of(upper); stop when upper <= lower (1 + tol), so that
    # upper (1 - tol) < lower spends more than the target.
    while upper > lower * (1 + tol):
        middle = math.sqrt(lower * upper)
        if epsilon_of(middle) <= target_epsilon:
            upper = middle
        else:
            lower = middle
    return upper

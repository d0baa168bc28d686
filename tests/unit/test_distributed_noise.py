"""Integer building blocks of secure aggregation and distributed DP: modular clipping as TFF's and
google-research's tests state it, the discrete Gaussian and Skellam samplers against their exact
probability mass functions, and conditional randomised rounding's norm bound."""
import math

import numpy as np
import pytest
import torch
from scipy import stats

from distfl.compression import keyed_generator
from distfl.privacy.discrete import discrete_gaussian, skellam
from distfl.secagg.modular import modular_clip, modular_sum, wraps
from distfl.secagg.rounding import conditional_round, rounded_norm_bound


# google-research/federated distributed_dp/modular_clipping_factory_test.py: (lower, upper, value, expected)
INDIVIDUAL = [(-5, 10, 5, 5), (-5, 10, -15, 0), (-5, 10, 20, 5), (-5, 10, -5, -5), (-5, 10, 10, -5),
              (-20, -10, -15, -15), (-20, -10, -25, -15), (-20, -10, -5, -15), (20, 40, 30, 30), (20, 40, 10, 30),
              (20, 40, 50, 30), (-2**30, 2**30 - 1, 2**30 + 5, -2**30 + 6), (-2**31 + 1, 0, 5, -2**31 + 6),
              (0, 2**31 - 1, -5, 2**31 - 6)]
SUMS = [(-3, 3, [1, -2, 1, -2], -2), (-3, 3, [-3, 3, 3, 3], 0), (-2, 2, [-3, 3, 5], 1), (-2, 2, [-4, -2, 1, 2, 7], 0)]


@pytest.mark.parametrize("lower,upper,value,expected", INDIVIDUAL)
def test_modular_clipping_of_one_value_matches_the_reference_cases(lower, upper, value, expected):
    assert int(modular_clip(torch.tensor([value]), lower, upper)) == expected


@pytest.mark.parametrize("lower,upper,values,expected", SUMS)
def test_modular_sums_match_the_reference_cases_in_any_order(lower, upper, values, expected):
    terms = [torch.tensor([v]) for v in values]
    assert int(modular_sum(terms, lower, upper)) == expected
    assert int(modular_sum(reversed(terms), lower, upper)) == expected
    # the plain integer sum, wrapped once, is the same: secure aggregation's sum is order-free
    assert int(modular_clip(torch.tensor([sum(values)]), lower, upper)) == expected


def test_wrap_counts_at_8_and_16_bits():
    values = torch.tensor([-129, -128, 0, 127, 128, 40_000, -32_769])
    assert wraps(values, -2**7, 2**7) == 4
    assert wraps(values, -2**15, 2**15) == 2
    with pytest.raises(ValueError, match="lower"):
        modular_clip(values, 3, 3)


def chi_square_p(counts: dict, pmf, support) -> float:
    observed = np.array([counts.get(k, 0) for k in support], dtype=float)
    total = sum(counts.values())
    expected = np.array([pmf(k) for k in support]) * total
    inside = expected.sum()
    observed = np.append(observed, total - observed.sum())
    expected = np.append(expected, total - inside)
    keep = expected > 5
    return stats.chisquare(observed[keep], expected[keep] * observed[keep].sum() / expected[keep].sum()).pvalue


def test_discrete_gaussian_matches_its_probability_mass_function():
    sigma = 2.5
    draws = discrete_gaussian(200_000, sigma, keyed_generator(1, 2)).numpy()
    weights = {k: math.exp(-k * k / (2 * sigma**2)) for k in range(-60, 61)}
    norm = sum(weights.values())
    values, counts = np.unique(draws, return_counts=True)
    p = chi_square_p(dict(zip(values.tolist(), counts.tolist())), lambda k: weights[k] / norm, range(-15, 16))
    assert p > 1e-3
    assert abs(draws.mean()) < 4 * sigma / math.sqrt(len(draws))


def test_discrete_gaussian_variance_and_keying():
    sigma = 30.0
    draws = discrete_gaussian((500, 400), sigma, keyed_generator(3)).double()
    assert draws.shape == (500, 400) and draws.dtype == torch.float64
    # the discrete Gaussian's variance is sigma^2 to within 1e-10 for sigma >= 1 (Canonne et al., Fact 20);
    # the sample variance's standard error is sigma^2 sqrt(2 / n)
    assert float(draws.var()) == pytest.approx(sigma**2, abs=4 * sigma**2 * math.sqrt(2 / draws.numel()))
    assert torch.equal(discrete_gaussian(1000, 4.0, keyed_generator(7)), discrete_gaussian(1000, 4.0, keyed_generator(7)))
    assert not torch.equal(discrete_gaussian(1000, 4.0, keyed_generator(7)), discrete_gaussian(1000, 4.0, keyed_generator(8)))


def test_skellam_matches_its_probability_mass_function():
    mu = 3.0
    draws = skellam(200_000, mu, keyed_generator(4)).numpy()
    values, counts = np.unique(draws, return_counts=True)
    p = chi_square_p(dict(zip(values.tolist(), counts.tolist())), lambda k: stats.skellam.pmf(k, mu, mu), range(-12, 13))
    assert p > 1e-3
    assert draws.var() == pytest.approx(2 * mu, abs=4 * 2 * mu * math.sqrt(2 / len(draws)))


def test_conditional_rounding_stays_within_the_bound_and_on_neighbouring_integers():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4096, generator=g, dtype=torch.float64) * 3
    beta = math.exp(-0.5)
    bound = rounded_norm_bound(float(x.norm()), beta, x.numel())
    assert bound < float(x.norm()) + math.sqrt(x.numel())  # the beta form is the tighter one here
    for i in range(20):
        rounded = conditional_round(x, beta, keyed_generator(6, i))
        assert rounded.dtype == torch.int64
        assert bool(((rounded == torch.floor(x)) | (rounded == torch.ceil(x))).all())
        assert float(rounded.double().norm()) <= bound
    # unconditionally (beta = 0) the rounding is unbiased: its mean over draws returns x
    mean = torch.stack([conditional_round(x[:64], 0.0, keyed_generator(7, i)).double() for i in range(4000)]).mean(0)
    assert float((mean - x[:64]).abs().max()) < 4 * 0.5 / math.sqrt(4000)


def test_rounded_norm_bound_is_the_papers_formula():
    # Kairouz, Liu & Steinke 2021, Section 4.1, recomputed by hand: c = 10, d = 100, beta = e^-0.5
    c, d, beta = 10.0, 100, math.exp(-0.5)
    second = math.sqrt(c**2 + d / 4 + math.sqrt(2 * 0.5) * (c + 0.5 * math.sqrt(d)))
    assert rounded_norm_bound(c, beta, d) == pytest.approx(min(c + 10, second), rel=1e-15)
    assert rounded_norm_bound(c, 0.0, d) == c + 10

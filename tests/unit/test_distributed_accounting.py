"""Epsilon of distributed DP (distfl/privacy/distributed_accounting.py) against the values of
google-research/federated's distributed_dp accounting, computed with its code (accounting_utils.py at
commit 5e27a86, tensorflow_privacy 0.7.3's RDP conversion) in three settings a mechanism: unsampled,
Poisson-sampled, and one where the discrete Gaussian's tau (or Skellam's L1 term) weighs; and the
epsilon-against-dropout curve of its plot_client_dropout.py (tests/fixtures/ddgauss_dropout.csv)."""
import csv
import math
from pathlib import Path

import pytest

from distfl.privacy.distributed_accounting import ddgauss_epsilon, ddgauss_tau, skellam_epsilon

BETA = math.exp(-0.5)

# (scale = 1 / gamma, local stddev, clients, clip, beta, d, q, rounds, delta) -> epsilon
DDGAUSS = [
    ((1e3, 0.5, 100, 1.0, BETA, 2**16, 1.0, 100, 1e-5), 10.906763480042894),
    ((1e3, 0.1, 100, 1.0, BETA, 2**16, 0.01, 1000, 1e-5), 2.5024211280193702),
    ((1 / 0.8, 0.5, 20, 0.5, 0.0, 4, 0.2, 20, 1e-6), 21.40091459254353),
]
# (scale, central stddev, clip, beta, d, q, rounds, delta) -> epsilon
SKELLAM = [
    ((1024.0, 5.0, 1.0, BETA, 2**16, 1.0, 100, 1e-5), 10.902033528539478),
    ((256.0, 1.0, 1.0, BETA, 2**16, 0.01, 1000, 1e-5), 3.26633159190103),
    ((4.0, 2.0, 0.5, 0.0, 10, 0.2, 300, 1e-6), 18.758413457138992),
]


@pytest.mark.parametrize("setting,expected", DDGAUSS, ids=["unsampled", "sampled", "tau"])
def test_ddgauss_epsilon_matches_google_researchs_accounting(setting, expected):
    scale, sigma, n, clip, beta, dim, q, steps, delta = setting
    assert ddgauss_epsilon(scale=scale, local_sigma=sigma, num_clients=n, l2_clip=clip, beta=beta, dim=dim, q=q,
                           steps=steps, delta=delta) == pytest.approx(expected, abs=1e-3)


def test_the_tau_setting_exercises_tau():
    assert ddgauss_tau(0.5 / 0.8, 20) > 0.4 and ddgauss_tau(0.5 / 1e-3, 100) == 0.0


@pytest.mark.parametrize("setting,expected", SKELLAM, ids=["unsampled", "sampled", "coarse-scale"])
def test_skellam_epsilon_matches_google_researchs_accounting(setting, expected):
    scale, central, clip, beta, dim, q, steps, delta = setting
    assert skellam_epsilon(scale=scale, central_sigma=central, l2_clip=clip, beta=beta, dim=dim, q=q, steps=steps,
                           delta=delta) == pytest.approx(expected, abs=1e-3)


def test_epsilon_against_client_dropout_reproduces_the_reference_curve():
    path = Path(__file__).parents[1] / "fixtures" / "ddgauss_dropout.csv"
    rows = list(csv.DictReader(line for line in path.open() if not line.startswith("#")))
    assert len(rows) == 5 * 31
    for row in rows:
        eps = ddgauss_epsilon(scale=1 / float(row["gamma"]), local_sigma=float(row["local_stddev"]),
                              num_clients=int(row["survivors"]), l2_clip=1.0, beta=BETA, dim=2**20, q=1.0, steps=1500,
                              delta=1e-5)
        assert eps == pytest.approx(float(row["epsilon"]), abs=1e-3), row
    # the curve's shape: losing 60% of the clients (and their noise) raises epsilon 8 -> 14.01
    last = [r for r in rows if r["initial_epsilon"] == "8" and r["dropout"] == "0.600"][0]
    assert float(last["epsilon"]) == pytest.approx(14.01, abs=0.01)


@pytest.mark.parametrize("mechanism", ["ddgauss", "skellam"])
def test_target_epsilon_calibrates_the_smallest_noise_that_reaches_it(mechanism):
    from distfl.config import load_config
    from distfl.secagg.aggregator import _distributed_dp, epsilon, noise_multiplier

    target, dim, rounds = 3.0, 2**13, 20
    cfg = load_config(None, [f"privacy.mechanism={mechanism}", f"privacy.target_epsilon={target}", "privacy.delta=1e-5",
                             "algorithm.weighting=uniform", "secagg.bits=16", "secagg.scale_bits=8",
                             f"train.rounds={rounds}", "train.clients_per_round=10"])
    z = noise_multiplier(cfg, dim)

    def spent(multiplier):  # what the run's accountant reports, with every client of a round surviving
        return epsilon(_distributed_dp(cfg, multiplier), 10, dim, rounds, 1e-5)

    assert spent(z) <= target < spent(z * (1 - 1e-4))
    assert spent(z) == pytest.approx(target, rel=1e-3)


def test_calibration_is_a_bounded_search_that_says_when_the_target_is_out_of_reach():
    from distfl.privacy.distributed_accounting import calibrate

    z = calibrate(lambda z: 10 / z, 2.0, tol=1e-6)
    assert 10 / z <= 2.0 < 10 / (z * (1 - 1e-6))
    with pytest.raises(ValueError, match="even noise_multiplier=10000 spends epsilon 0.001"):
        calibrate(lambda z: 10 / z, 1e-4)

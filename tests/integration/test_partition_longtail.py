"""The `longtail` scheme (FedFOR's imbalanced-CIFAR clients, Cao et al. 2019 long tail per client)."""
import numpy as np
import pytest

from conftest import train_ok, write_config
from distfl.data.partition import describe, longtail_client, partition
from distfl.errors import DataError
from distfl.federation.population import Population
from distfl.config.schema import PartitionConfig

CIFAR_LIKE = np.repeat(np.arange(10), 5000)  # 50,000 balanced labels of 10 classes
np.random.RandomState(7).shuffle(CIFAR_LIKE)
PAPER_PROFILE = [500, 299, 179, 107, 64, 38, 23, 13, 8, 5]  # fedfor.md Sec. 2.2: 1,236 samples = 2.47%


def _hist(part, labels=CIFAR_LIKE):
    return np.bincount(labels[part], minlength=10)


def test_pure_function_of_inputs_and_per_client():
    cfg = PartitionConfig(scheme="longtail", num_clients=8)
    a = partition(CIFAR_LIKE, cfg, 10, seed=0)
    b = partition(CIFAR_LIKE.copy(), cfg, 10, seed=0)
    assert all(x.dtype == np.int64 and np.array_equal(x, y) for x, y in zip(a, b))
    c = partition(CIFAR_LIKE, cfg, 10, seed=1)
    assert not any(np.array_equal(np.sort(x), np.sort(y)) for x, y in zip(a, c))
    # Client k does not depend on how many clients there are: a bigger population extends a smaller one.
    more = partition(CIFAR_LIKE, PartitionConfig(scheme="longtail", num_clients=20), 10, seed=0)
    assert all(np.array_equal(x, y) for x, y in zip(a, more[:8]))
    # Clients differ from each other, and each list is shuffled, duplicate-free.
    assert len({tuple(np.sort(p)) for p in more}) == 20
    assert all(len(np.unique(p)) == len(p) and not np.all(np.diff(p) > 0) for p in more)


def test_exponential_profile_with_a_random_head_and_about_2_5_percent():
    parts = partition(CIFAR_LIKE, PartitionConfig(scheme="longtail", num_clients=40), 10, seed=0)
    heads, sizes = [], []
    for p in parts:
        h = _hist(p)
        ranked = np.sort(h)[::-1]
        n_max = ranked[0]
        # n_max is the smallest class count in the client's 10% draw: <= 500, and ~470 on average.
        assert 420 <= n_max <= 500
        expected = [int(np.floor(n_max * 0.01 ** (r / 9) + 1e-9)) for r in range(10)]
        assert ranked.tolist() == expected
        assert h.min() == expected[-1] >= 4  # every class is present, the tail at 1% of the head
        heads.append(int(h.argmax()))
        sizes.append(len(p))
    assert len(set(heads)) >= 8  # the head class is random per client
    mean_share = np.mean(sizes) / len(CIFAR_LIKE)
    assert 0.021 <= mean_share <= 0.0248  # the paper's "~2.5%"; our n_max = min class count gives ~2.3%
    assert max(sizes) <= sum(PAPER_PROFILE)


def test_paper_profile_when_the_draw_is_exactly_balanced():
    # 5,000 labels, 500 per class, subsample 1: the draw is everything, n_max = 500 -> the paper's numbers.
    labels = np.repeat(np.arange(10), 500)
    part = longtail_client(labels, 10, subsample=1.0, imbalance_ratio=0.01, base_seed=0, client=3)
    h = np.bincount(labels[part], minlength=10)
    assert np.sort(h)[::-1].tolist() == PAPER_PROFILE and len(part) == 1236


def test_imbalance_ratio_and_subsample_are_used():
    flat = partition(CIFAR_LIKE, PartitionConfig(scheme="longtail", num_clients=3, imbalance_ratio=1.0), 10, 0)
    for p in flat:
        h = _hist(p)
        assert h.min() == h.max()  # ratio 1: balanced, n_max per class
    half = partition(CIFAR_LIKE, PartitionConfig(scheme="longtail", num_clients=3, subsample=0.5), 10, 0)
    assert all(2400 <= _hist(p).max() <= 2500 for p in half)


def test_sequential_cohort_meets_fresh_clients_every_round():
    rounds, k = 6, 5
    parts = partition(CIFAR_LIKE, PartitionConfig(scheme="longtail", num_clients=rounds * k), 10, seed=0)
    pop = Population(parts, CIFAR_LIKE, 10)
    cohorts = [pop.cohort(0, t, k, "sequential") for t in range(1, rounds + 1)]
    seen = [c for cohort in cohorts for c in cohort]
    assert len(seen) == len(set(seen)) == rounds * k
    assert cohorts[0] == [0, 1, 2, 3, 4] and cohorts[-1] == [25, 26, 27, 28, 29]
    assert "30 clients" in describe(parts, CIFAR_LIKE, 10)


def test_too_little_data_is_a_clear_error():
    labels = np.repeat(np.arange(10), 2)  # a 10% draw of 20 samples cannot hold every class
    with pytest.raises(DataError, match="longtail"):
        partition(labels, PartitionConfig(scheme="longtail", num_clients=2), 10, seed=0)


def test_trains_end_to_end_with_fresh_clients(tmp_path):
    cfg = write_config(tmp_path / "lt.yaml", partition={"scheme": "longtail", "num_clients": 30, "subsample": 0.5},
                       train={"rounds": 6, "clients_per_round": 5, "cohort": "sequential", "lr": 0.05},
                       algorithm={"name": "fedfor", "fedfor_alpha": 0.5, "weighting": "uniform"})
    s = train_ok(cfg, f"output.dir={tmp_path / 'run'}")
    assert s["status"] == "completed" and s["rounds"] == 6

"""Clients' index arrays held end to end (distfl/data/parts.py): a natural federation's population is built
with array operations only, and gives the same clients, sizes, class counts, partition fingerprint and
models as the per-client arrays it replaced."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from conftest import train_ok, write_config
from distfl.config.schema import PartitionConfig
from distfl.data.natural import natural_parts, natural_test_sets
from distfl.data.partition import partition
from distfl.data.parts import Parts
from distfl.federation.population import Population
from test_fedprox_synthetic import SYNTH


def test_a_natural_federations_clients_are_their_own_ranges():
    offsets = np.array([0, 3, 4, 9, 9, 15], dtype=np.int64)
    for parts in (natural_parts(offsets[[0, 1, 2, 3, 5]], 4), natural_test_sets(offsets)):
        bounds = parts.offsets
        assert len(parts) == len(bounds) - 1
        for k in range(len(parts)):
            expected = np.arange(bounds[k], bounds[k + 1])
            assert parts[k].dtype == np.int64 and np.array_equal(parts[k], expected)
        assert [list(p) for p in parts] == [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]
    parts = Parts.ranges(offsets)
    assert np.array_equal(parts[-1], np.arange(9, 15)) and len(parts[3]) == 0
    assert [list(p) for p in parts[1:3]] == [[3], [4, 5, 6, 7, 8]]
    with pytest.raises(IndexError):
        parts[5]


def _fingerprint_as_before(parts: list[np.ndarray]) -> int:
    """Population.fingerprint as the release before Parts computed it: SHA-256 over the sizes, then the
    clients' indices concatenated in blocks of 4,096 clients."""
    digest = hashlib.sha256()
    digest.update(np.array([len(p) for p in parts], dtype="<i8").tobytes())
    for start in range(0, len(parts), 4096):
        digest.update(np.concatenate(parts[start:start + 4096]).astype("<i8").tobytes())
    return int.from_bytes(digest.digest()[:8], "little") >> 2


@pytest.mark.parametrize("scheme", ["iid", "natural"])
def test_population_is_the_same_from_arrays_or_parts(scheme):
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, 20000)
    if scheme == "natural":
        offsets = np.concatenate([[0], np.cumsum(rng.integers(1, 5, 2500))])
        labels = labels[:offsets[-1]]
        drawn = natural_parts(offsets, 2500)
    else:
        drawn = partition(labels, PartitionConfig(scheme="iid", num_clients=5000), 7, 3)  # > 4,096 clients
    arrays = [np.array(p, dtype=np.int32) for p in drawn]  # any integer arrays, as a plugin's partition may give
    if scheme == "iid":
        arrays.insert(3, np.zeros(0, dtype=np.int32))  # and an empty client
        drawn = list(drawn[:3]) + [np.zeros(0, dtype=np.int64)] + list(drawn[3:])
    one, other = Population(arrays, labels, 7), Population(Parts.of(arrays), labels, 7)
    for population in (one, other, Population(drawn, labels, 7)):
        assert len(population) == len(arrays)
        assert np.array_equal(population.sizes, [len(p) for p in arrays]) and population.sizes.dtype == np.int64
        assert all(np.array_equal(population.indices[k], arrays[k]) and population.indices[k].dtype == np.int64
                   for k in range(len(arrays)))
        counts = np.stack([np.bincount(labels[p], minlength=7) for p in arrays])
        assert np.array_equal(population.class_counts, counts)
        assert population.fingerprint() == _fingerprint_as_before(arrays)


def test_natural_run_keeps_the_model_of_before(tmp_path):
    """FedProx on Synthetic(1,1) with per-client evaluation: the model and client metrics of the release
    before the populations were held end to end."""
    cfg = write_config(tmp_path / "synth.yaml", SYNTH)
    done = train_ok(cfg, f"output.dir={tmp_path / 'run'}")
    assert done["model_sha256"] == "0ca8b131b385e9010c64636f4899a71c8c60feaf5a1f0c9c9267ff5de015670f"

"""data.normalize: auto (today's inputs, bit for bit), none ([0, 1] pixels), mean_std (training statistics)."""
import gzip
import os

import numpy as np
import pytest
import torch

import distfl.data.datasets as datasets
from distfl.config import load_config
from distfl.data.datasets import CIFAR_STATS, FMNIST_FILES, Dataset, load_dataset, training_mean_std
from distfl.errors import ConfigError, DataError
from distfl.config.schema import DataConfig

DEBIAN = datasets.DEBIAN_FMNIST_DIR
needs_fmnist = pytest.mark.skipif(
    not all(os.path.exists(os.path.join(DEBIAN, f)) for f in FMNIST_FILES),
    reason="apt-get install dataset-fashion-mnist",
)


def fmnist(normalize):
    return load_dataset(DataConfig(dataset="fmnist", root="/nonexistent-distfl-root", download=False,
                                   normalize=normalize), seed=0)


def raw_fmnist_pixels(prefix):
    """The uint8 pixels of an FMNIST split, read here without distfl (IDX: a 16-byte header, then bytes)."""
    with gzip.open(os.path.join(DEBIAN, f"{prefix}-images-idx3-ubyte.gz"), "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=16).reshape(-1, 1, 28, 28)


@pytest.fixture(scope="module")
def fmnist_none():
    return fmnist("none")


@needs_fmnist
def test_fmnist_auto_and_none_are_todays_pixels_over_255(fmnist_none):
    auto = fmnist("auto")
    for split, ds_x in (("train", auto.train_x), ("t10k", auto.test_x)):
        expected = torch.from_numpy(raw_fmnist_pixels(split).astype(np.float32)) / 255
        assert torch.equal(ds_x, expected)
    assert torch.equal(auto.train_x, fmnist_none.train_x) and torch.equal(auto.test_x, fmnist_none.test_x)
    assert auto.normalization is None and fmnist_none.normalization is None


@needs_fmnist
def test_fmnist_statistics_are_the_training_split_mean_and_std(fmnist_none):
    inputs = (raw_fmnist_pixels("train").astype(np.float32) / 255).astype(np.float64)  # what the model sees
    (mean,), (std,) = training_mean_std(fmnist_none.train_x)
    # An independent float64 computation, and the TCT authors' Normalize((0.2860,), (0.3530,)).
    assert mean == pytest.approx(inputs.mean(), rel=1e-12) and std == pytest.approx(inputs.std(), rel=1e-12)
    assert round(mean, 4) == 0.2860 and round(std, 4) == 0.3530


@needs_fmnist
def test_fmnist_mean_std_standardises_train_and_uses_its_statistics_on_test(fmnist_none):
    ds = fmnist("mean_std")
    (mean,), (std,) = ds.normalization
    assert (mean, std) == tuple(v[0] for v in training_mean_std(fmnist_none.train_x))
    assert abs(ds.train_x.double().mean().item()) < 1e-6
    assert ds.train_x.double().std(unbiased=False).item() == pytest.approx(1, abs=1e-6)
    mean32, std32 = torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32)
    assert torch.equal(ds.test_x, (fmnist_none.test_x - mean32) / std32)
    assert abs(ds.test_x.double().mean().item()) > 1e-3  # the test split's own mean (0.2868) is not subtracted
    assert torch.equal(ds.train_y, fmnist_none.train_y) and torch.equal(ds.test_y, fmnist_none.test_y)


def fake_cifar(monkeypatch, name):
    """Replace the CIFAR download by random [0, 1] pixels of CIFAR's shape (5 of each split)."""
    g = torch.Generator().manual_seed(1)
    train_x = torch.randint(0, 256, (50, 3, 32, 32), generator=g).float() / 255
    test_x = torch.randint(0, 256, (20, 3, 32, 32), generator=g).float() / 255
    raw = Dataset(train_x, torch.arange(50) % 10, test_x, torch.arange(20) % 10, 10, name, None)
    monkeypatch.setattr(datasets, "_load_cifar", lambda cfg: raw)
    return raw


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_cifar_auto_is_the_fixed_statistics_as_before(monkeypatch, name):
    raw = fake_cifar(monkeypatch, name)
    ds = load_dataset(DataConfig(dataset=name, normalize="auto"), seed=0)
    # What _load_cifar computed before data.normalize existed.
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in CIFAR_STATS[name])
    assert torch.equal(ds.train_x, (raw.train_x - mean) / std) and torch.equal(ds.test_x, (raw.test_x - mean) / std)
    assert ds.normalization == CIFAR_STATS[name]
    assert torch.equal(load_dataset(DataConfig(dataset=name, normalize="none"), seed=0).train_x, raw.train_x)


def test_mean_std_is_per_channel(monkeypatch):
    raw = fake_cifar(monkeypatch, "cifar10")
    raw.train_x[:, 1] = raw.train_x[:, 1] * 0.5 + 0.3  # channels with different statistics
    ds = load_dataset(DataConfig(dataset="cifar10", normalize="mean_std"), seed=0)
    pixels = raw.train_x.numpy().astype(np.float64)
    assert np.allclose(ds.normalization[0], pixels.mean(axis=(0, 2, 3)), rtol=1e-12, atol=0)
    assert np.allclose(ds.normalization[1], pixels.std(axis=(0, 2, 3)), rtol=1e-12, atol=0)
    per_channel = ds.train_x.double().transpose(0, 1).flatten(1)
    assert per_channel.mean(1).abs().max() < 1e-6
    assert torch.allclose(per_channel.std(1, unbiased=False), torch.ones(3, dtype=torch.float64), atol=1e-6)


def test_files_use_their_own_training_statistics(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"  # vectors N x D: one channel
    np.savez(path, x_train=rng.normal(3, 2, (40, 5)).astype(np.float32), y_train=np.arange(40) % 2,
             x_test=rng.normal(3, 2, (10, 5)).astype(np.float32), y_test=np.arange(10) % 2)
    none = load_dataset(DataConfig(dataset="files", path=str(path), normalize="none"), seed=0)
    auto = load_dataset(DataConfig(dataset="files", path=str(path)), seed=0)
    ds = load_dataset(DataConfig(dataset="files", path=str(path), normalize="mean_std"), seed=0)
    assert torch.equal(auto.train_x, none.train_x)
    x_train = np.load(path)["x_train"].astype(np.float64)
    assert ds.normalization[0][0] == pytest.approx(x_train.mean(), rel=1e-12)
    assert ds.normalization[1][0] == pytest.approx(x_train.std(), rel=1e-12)
    assert abs(ds.train_x.double().mean().item()) < 1e-6


def test_synthetic_mean_std_and_a_constant_channel_is_refused():
    cfg = DataConfig(dataset="synthetic", synthetic_train=200, synthetic_test=50, synthetic_channels=2,
                     normalize="mean_std")
    ds = load_dataset(cfg, seed=0)
    assert ds.train_x.transpose(0, 1).flatten(1).double().mean(1).abs().max() < 1e-6
    with pytest.raises(DataError, match="channel 1 .* constant"):
        training_mean_std(torch.cat([torch.rand(4, 1, 3, 3), torch.full((4, 1, 3, 3), 0.5)], dim=1))


def test_unknown_value_is_refused():
    with pytest.raises(ConfigError, match="mean_std"):
        load_config(None, ["data.normalize=meanstd"])

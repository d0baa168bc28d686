import gzip
import os
import shutil
import struct
from urllib.error import URLError

import pytest
import torch
import torch.nn.functional as F

import distfl.data.datasets as datasets
from distfl.data.datasets import FMNIST_FILES, find_fmnist, load_dataset, random_crop_flip
from distfl.errors import DataError
from distfl.config.schema import DataConfig

DEBIAN = datasets.DEBIAN_FMNIST_DIR
needs_fmnist = pytest.mark.skipif(
    not all(os.path.exists(os.path.join(DEBIAN, f)) for f in FMNIST_FILES),
    reason="apt-get install dataset-fashion-mnist",
)


@pytest.fixture(scope="module")
def fmnist():
    return load_dataset(DataConfig(dataset="fmnist", root="/nonexistent-distfl-root", download=False), seed=0)


@needs_fmnist
def test_fmnist_loads(fmnist):
    assert fmnist.train_x.shape == (60000, 1, 28, 28) and fmnist.test_x.shape == (10000, 1, 28, 28)
    assert fmnist.train_x.dtype == torch.float32 and fmnist.train_y.dtype == torch.int64
    assert fmnist.train_x.min() >= 0 and fmnist.train_x.max() <= 1 and fmnist.train_x.max() > 0.99
    assert torch.equal(fmnist.train_y.unique(), torch.arange(10))
    assert torch.equal(fmnist.test_y.unique(), torch.arange(10))
    assert fmnist.num_classes == 10 and fmnist.name == "fmnist" and fmnist.input_shape == (1, 28, 28)
    assert fmnist.augment is None
    assert fmnist.to("cpu").train_x.shape == fmnist.train_x.shape


def link_files(src, dst, names=FMNIST_FILES):
    os.makedirs(dst, exist_ok=True)
    for name in names:
        os.symlink(os.path.join(src, name), os.path.join(dst, name))


@needs_fmnist
def test_root_beats_debian(tmp_path):
    link_files(DEBIAN, tmp_path)
    assert find_fmnist(str(tmp_path)) == str(tmp_path)


@needs_fmnist
def test_torchvision_layout(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    link_files(DEBIAN, raw)
    assert find_fmnist(str(tmp_path)) == str(raw)


@needs_fmnist
def test_falls_back_to_debian(tmp_path):
    assert find_fmnist(str(tmp_path)) == DEBIAN


@needs_fmnist
def test_uncompressed_files_accepted(tmp_path):
    link_files(DEBIAN, tmp_path, FMNIST_FILES[:2])
    for name in FMNIST_FILES[2:]:
        with gzip.open(os.path.join(DEBIAN, name)) as f, open(tmp_path / name[:-3], "wb") as out:
            shutil.copyfileobj(f, out)
    assert find_fmnist(str(tmp_path)) == str(tmp_path)
    x, y = datasets._read_fmnist_split(str(tmp_path), "t10k")
    x_ref, y_ref = datasets._read_fmnist_split(DEBIAN, "t10k")
    assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_missing_everywhere_explains_both_ways(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets, "DEBIAN_FMNIST_DIR", str(tmp_path / "no-debian"))
    with pytest.raises(DataError) as err:
        load_dataset(DataConfig(dataset="fmnist", root=str(tmp_path), download=False), seed=0)
    msg = str(err.value)
    assert "apt-get install dataset-fashion-mnist" in msg and "data.root" in msg
    assert str(tmp_path) in msg and "no-debian" in msg and "data.download" in msg


def test_offline_download_failure_is_wrapped(tmp_path, monkeypatch):
    import torchvision.datasets

    def offline(*args, **kwargs):
        print("Failed to download (trying next):")
        raise RuntimeError("Error downloading train-images-idx3-ubyte.gz:\n<urlopen error no network>")

    monkeypatch.setattr(datasets, "DEBIAN_FMNIST_DIR", str(tmp_path / "no-debian"))
    monkeypatch.setattr(torchvision.datasets, "FashionMNIST", offline)
    with pytest.raises(DataError) as err:
        find_fmnist(str(tmp_path), download=True)
    msg = str(err.value)
    assert "urlopen error no network" in msg and "apt-get install dataset-fashion-mnist" in msg
    assert err.value.__cause__ is None and err.value.__suppress_context__


@needs_fmnist
def test_truncated_gz_names_the_file(tmp_path):
    link_files(DEBIAN, tmp_path, [n for n in FMNIST_FILES if n != "t10k-labels-idx1-ubyte.gz"])
    data = open(os.path.join(DEBIAN, "t10k-labels-idx1-ubyte.gz"), "rb").read()
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte.gz"):
        load_dataset(DataConfig(dataset="fmnist", root=str(tmp_path), download=False), seed=0)


def write_idx(path, magic, dims, payload):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)


@pytest.mark.parametrize(
    "magic, dims, payload, match",
    [
        (0x803, (5,), bytes(5), "magic"),  # a labels file with the images magic
        (0x801, (5,), bytes(4), "header says 5 items"),  # too short
        (0x801, (5,), bytes(6), "header says 5 items"),  # too long
    ],
)
def test_idx_validation(tmp_path, magic, dims, payload, match):
    path = str(tmp_path / "labels.gz")
    write_idx(path, magic, dims, payload)
    with pytest.raises(DataError, match=match):
        datasets._read_idx(path, 0x801, ())


def test_idx_roundtrip_and_not_gzip(tmp_path):
    path = str(tmp_path / "images.gz")
    write_idx(path, 0x803, (2, 28, 28), bytes(range(256)) * 6 + bytes(2 * 784 - 1536))
    assert datasets._read_idx(path, 0x803, (28, 28)).shape == (2, 28, 28)
    (tmp_path / "junk.gz").write_bytes(b"not a gzip file at all")
    with pytest.raises(DataError, match="junk.gz"):
        datasets._read_idx(str(tmp_path / "junk.gz"), 0x803, (28, 28))


@pytest.mark.parametrize("name, folder", [("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python")])
def test_cifar_missing_offline(tmp_path, name, folder):
    with pytest.raises(DataError) as err:
        load_dataset(DataConfig(dataset=name, root=str(tmp_path), download=False), seed=0)
    assert folder in str(err.value) and "data.download=true" in str(err.value)


def test_synthetic_deterministic():
    cfg = DataConfig(dataset="synthetic", synthetic_train=300, synthetic_test=100, synthetic_channels=3,
                     synthetic_image_size=6, synthetic_classes=4)
    a, b, c = load_dataset(cfg, seed=5), load_dataset(cfg, seed=5), load_dataset(cfg, seed=6)
    assert a.train_x.shape == (300, 3, 6, 6) and a.test_x.shape == (100, 3, 6, 6)
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64
    assert a.num_classes == 4 and a.input_shape == (3, 6, 6) and a.augment is None
    assert torch.equal(a.train_x, b.train_x) and torch.equal(a.test_y, b.test_y)
    assert not torch.equal(a.train_x, c.train_x)
    assert set(a.train_y.tolist()) == {0, 1, 2, 3}


def test_synthetic_learnable_not_trivial():
    ds = load_dataset(DataConfig(dataset="synthetic"), seed=0)
    means = torch.stack([ds.train_x[ds.train_y == c].mean(0) for c in range(ds.num_classes)])
    dist = ((ds.test_x[:, None] - means[None]) ** 2).flatten(2).sum(-1)
    acc = (dist.argmin(1) == ds.test_y).float().mean().item()
    assert 0.5 < acc < 0.97  # nearest class mean, about the best any model can do here


def test_augment_choice():
    cfg = DataConfig(dataset="synthetic", synthetic_train=10, synthetic_test=10)
    assert load_dataset(cfg, 0).augment is None
    cfg.augment = "crop_flip"
    assert load_dataset(cfg, 0).augment is random_crop_flip


def find_crop(out, padded, size, padding):
    """All (dy, dx, flipped) such that `out` is that crop of `padded`."""
    found = []
    for dy in range(2 * padding + 1):
        for dx in range(2 * padding + 1):
            crop = padded[:, dy:dy + size, dx:dx + size]
            for flipped, cand in ((False, crop), (True, crop.flip(2))):
                if torch.equal(out, cand):
                    found.append((dy, dx, flipped))
    return found


def test_random_crop_flip_is_a_crop():
    torch.manual_seed(0)
    x = torch.rand(64, 3, 8, 8)
    out = random_crop_flip(x, padding=2)
    assert out.shape == x.shape
    padded = F.pad(x, (2, 2, 2, 2), mode="reflect")
    offsets = set()
    for i in range(len(x)):
        found = find_crop(out[i], padded[i], 8, 2)
        assert len(found) == 1
        offsets.add(found[0])
    assert len(offsets) > 10  # offsets and flips differ per sample
    assert {f for _, _, f in offsets} == {False, True}


def test_random_crop_flip_padding_zero_only_flips():
    torch.manual_seed(1)
    x = torch.rand(32, 1, 5, 5)
    out = random_crop_flip(x, padding=0)
    flipped = [torch.equal(o, xi.flip(2)) for o, xi in zip(out, x)]
    kept = [torch.equal(o, xi) for o, xi in zip(out, x)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert any(flipped) and any(kept)


def test_random_crop_flip_uses_global_rng():
    x = torch.rand(16, 3, 32, 32)
    torch.manual_seed(7)
    a = random_crop_flip(x)
    torch.manual_seed(7)
    b = random_crop_flip(x)
    assert torch.equal(a, b)

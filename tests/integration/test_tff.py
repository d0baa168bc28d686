"""data.dataset=tff: TFF's HDF5 client data (examples/<client id>/<feature>), written here with h5py in
TFF's layout and dtypes, read back client by client; refusals of malformed files; a run and a prepare."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import run_cli, train_ok, write_config
from distfl.data.tff import load_tff
from distfl.errors import DataError


def _write_h5(path: Path, clients: dict) -> None:
    """clients: id -> {feature: array}; one group per client under `examples`, as TFF's files are."""
    with h5py.File(path, "w") as f:
        examples = f.create_group("examples")
        for client, features in clients.items():
            group = examples.create_group(client)
            for name, value in features.items():
                group.create_dataset(name, data=value)


def _emnist(root: Path, sizes=None) -> dict:
    rng = np.random.default_rng(0)
    sizes = sizes or {"f0001_22": (4, 2), "f0000_14": (3, 1), "f0002_07": (5, 2)}
    data = {}
    for split, which in (("train", 0), ("test", 1)):
        clients = {c: {"pixels": rng.random((n[which], 28, 28), dtype=np.float32),
                       "label": rng.integers(0, 62, n[which]).astype(np.int32)} for c, n in sizes.items()}
        _write_h5(root / f"fed_emnist_{split}.h5", clients)
        data[split] = clients
    return data


def test_fed_emnist_clients_and_their_own_test_samples(tmp_path):
    data = _emnist(tmp_path)
    fed = load_tff(str(tmp_path))
    assert fed.client_ids == ["f0000_14", "f0001_22", "f0002_07"] and fed.num_classes == 62
    np.testing.assert_array_equal(np.diff(fed.train_offsets), [3, 4, 5])
    np.testing.assert_array_equal(np.diff(fed.test_offsets), [1, 2, 2])
    for k, client in enumerate(fed.client_ids):
        part = slice(fed.train_offsets[k], fed.train_offsets[k + 1])
        np.testing.assert_array_equal(fed.train_x[part, 0], data["train"][client]["pixels"])
        np.testing.assert_array_equal(fed.train_y[part], data["train"][client]["label"])
        own = slice(fed.test_offsets[k], fed.test_offsets[k + 1])
        np.testing.assert_array_equal(fed.test_x[own, 0], data["test"][client]["pixels"])


def test_fed_cifar100_test_clients_are_the_test_split(tmp_path):
    rng = np.random.default_rng(1)

    def clients(names, n):
        return {c: {"image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                    "label": rng.integers(0, 100, n), "coarse_label": rng.integers(0, 20, n)} for c in names}

    train, test = clients(["0", "1", "10", "2"], 3), clients(["0", "1"], 2)
    _write_h5(tmp_path / "fed_cifar100_train.h5", train)
    _write_h5(tmp_path / "fed_cifar100_test.h5", test)
    fed = load_tff(str(tmp_path))
    assert fed.client_ids == ["0", "1", "10", "2"] and fed.num_classes == 100
    assert fed.train_x.shape == (12, 3, 32, 32) and fed.test_x.shape == (4, 3, 32, 32)
    np.testing.assert_array_equal(fed.train_x[6], train["10"]["image"][0].transpose(2, 0, 1).astype(np.float32) / 255)
    np.testing.assert_array_equal(fed.test_y, np.concatenate([test["0"]["label"], test["1"]["label"]]))
    assert not fed.test_offsets.any()  # no training client has test samples of its own


@pytest.mark.parametrize("damage, message", [
    (lambda c: c["f0000_14"].pop("label"), "client 'f0000_14' lacks label"),
    (lambda c: c["f0000_14"].update(label=np.zeros(7, np.int32)), "they must pair one to one"),
    (lambda c: c["f0000_14"].update(pixels=np.zeros((3, 28, 28), np.int64)), "fed_emnist stores float 28 x 28"),
    (lambda c: c["f0000_14"].update(label=np.full(3, 70, np.int32)), "outside 0..61"),
])
def test_malformed_files_are_refused_in_one_line(tmp_path, damage, message):
    rng = np.random.default_rng(2)
    clients = {c: {"pixels": rng.random((3, 28, 28), dtype=np.float32), "label": np.zeros(3, np.int32)}
               for c in ("f0000_14", "f0001_22")}
    _write_h5(tmp_path / "fed_emnist_test.h5", clients)
    damage(clients)
    _write_h5(tmp_path / "fed_emnist_train.h5", clients)
    with pytest.raises(DataError) as info:
        load_tff(str(tmp_path))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_missing_group_and_unpaired_files_are_refused(tmp_path):
    with h5py.File(tmp_path / "fed_emnist_train.h5", "w") as f:
        f.create_group("clients")
    with h5py.File(tmp_path / "fed_emnist_test.h5", "w") as f:
        f.create_group("examples")
    with pytest.raises(DataError, match="has no group 'examples'"):
        load_tff(str(tmp_path))
    other = tmp_path / "so"
    other.mkdir()
    (other / "stackoverflow_train.h5").write_bytes(b"")  # its test file is missing
    with pytest.raises(DataError, match="holds no pair PREFIX_train.h5, PREFIX_test.h5"):
        load_tff(str(other))


def test_run_and_prepare_give_the_same_model(tmp_path):
    (tmp_path / "tff").mkdir()
    _emnist(tmp_path / "tff", sizes={f"f{k:04d}_00": (6 + k, 2) for k in range(5)})
    assert run_cli(["data", "prepare", "tff", "--from", str(tmp_path / "tff"), "--out", str(tmp_path / "p")]).returncode == 0
    cfg = write_config(tmp_path / "c.yaml", {
        "seed": 4, "partition": {"scheme": "natural", "num_clients": 5}, "model": {"name": "mlp", "mlp_hidden": 16},
        "train": {"rounds": 2, "clients_per_round": 3, "lr": 0.1, "batch_size": 4},
        "eval": {"every": 1, "clients": True}, "output": {"progress": "none", "tensorboard": False}})
    direct = train_ok(cfg, "data.dataset=tff", f"data.path={tmp_path / 'tff'}", f"output.dir={tmp_path / 'a'}")
    prepared = train_ok(cfg, "data.dataset=prepared", f"data.path={tmp_path / 'p'}", f"output.dir={tmp_path / 'b'}")
    assert direct["model_sha256"] == prepared["model_sha256"]

"""data.dataset=leaf: LEAF's JSON files, written here as LEAF's preprocessing writes them (json.dump of
{users, num_samples, user_data[, hierarchies]}, its train/test split by a transcription of
data/utils/split_data.py), read back client by client; refusals of malformed files; the FEMNIST CNN and
the Shakespeare LSTM; 1 rank == 2 ranks == resumed with the LSTM."""
from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import assert_packs_train_as_one_at_a_time, one_two_resumed, run_cli, write_config
from distfl.data.leaf import ALL_LETTERS, load_leaf
from distfl.errors import DataError

# LEAF's vocabulary, models/utils/language_utils.py, as printed there.
LEAF_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"


def _write(path: Path, users, user_data, hierarchies=None):
    data = {"users": users}
    if hierarchies is not None:
        data["hierarchies"] = hierarchies
    data["num_samples"] = [len(user_data[u]["y"]) for u in users]
    data["user_data"] = user_data
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f)


def _shakespeare_all_data(root: Path, length: int = 20, seed: int = 0) -> dict:
    """Two all_data files of Shakespeare-style users: x = `length` characters, y = the next one."""
    rng = np.random.default_rng(seed)
    written = {}
    for f, users in enumerate([["THE_TEMPEST_PROSPERO", "THE_TEMPEST_MIRANDA", "HAMLET_ONE_LINE"],
                               ["KING_LEAR_LEAR", "KING_LEAR_FOOL"]]):
        user_data = {}
        for u in users:
            n = 1 if u == "HAMLET_ONE_LINE" else int(rng.integers(6, 14))
            text = "".join(rng.choice(list(LEAF_LETTERS), size=n + length))
            user_data[u] = {"x": [text[i:i + length] for i in range(n)], "y": [text[i + length] for i in range(n)]}
        written.update(user_data)
        _write(root / "all_data" / f"all_data_{f}.json", users, user_data, hierarchies=[u.split("_")[0] for u in users])
    return written


def _split_like_leaf(root: Path, by_user: bool, seed: int, frac: float = 0.9) -> None:
    """A transcription of LEAF's data/utils/split_data.py (files in sorted order, rng = Random(seed))."""
    rng = random.Random(seed)
    files = sorted(p.name for p in (root / "all_data").iterdir())
    label = str(frac)[2:]
    if by_user:
        user_files = []
        for f in files:
            data = json.loads((root / "all_data" / f).read_text())
            user_files.extend([(u, ns, f) for (u, ns) in zip(data["users"], data["num_samples"])])
        num_users = len(user_files)
        train_indices = rng.sample([i for i in range(num_users)], int(frac * num_users))
        blist = [False for _ in range(num_users)]
        for i in train_indices:
            blist[i] = True
        for which, keep in (("train", True), ("test", False)):
            chosen = [t for i, t in enumerate(user_files) if blist[i] == keep]
            data = {"users": [], "num_samples": [], "user_data": {}}
            for u, ns, f in chosen:
                data["users"].append(u)
                data["num_samples"].append(ns)
                data["user_data"][u] = json.loads((root / "all_data" / f).read_text())["user_data"][u]
            (root / which).mkdir(exist_ok=True)
            (root / which / f"all_data_0_{which}_{label}.json").write_text(json.dumps(data))
        return
    for f in files:
        data = json.loads((root / "all_data" / f).read_text())
        out = {w: {"users": [], "num_samples": [], "user_data": {}} for w in ("train", "test")}
        for u in data["users"]:
            out["train"]["user_data"][u] = {"x": [], "y": []}
            out["test"]["user_data"][u] = {"x": [], "y": []}
            n = len(data["user_data"][u]["y"])
            if n >= 2:
                n_train = max(1, int(frac * n))
                if n == 2:
                    n_train = 1
                train_indices = rng.sample([j for j in range(n)], n_train)
                blist = [False for _ in range(n)]
                for j in train_indices:
                    blist[j] = True
                for j in range(n):
                    which = "train" if blist[j] else "test"
                    out[which]["user_data"][u]["x"].append(data["user_data"][u]["x"][j])
                    out[which]["user_data"][u]["y"].append(data["user_data"][u]["y"][j])
                for which, count in (("train", n_train), ("test", n - n_train)):
                    out[which]["users"].append(u)
                    out[which]["num_samples"].append(count)
        for which in ("train", "test"):
            (root / which).mkdir(exist_ok=True)
            (root / which / f"{f[:-5]}_{which}_{label}.json").write_text(json.dumps(out[which]))


def test_vocabulary_is_leafs():
    assert ALL_LETTERS == LEAF_LETTERS and len(ALL_LETTERS) == 80


@pytest.mark.parametrize("by_user", [False, True])
def test_shakespeare_split_as_leaf_writes_it(tmp_path, by_user):
    """The train/ and test/ files LEAF's split writes load client by client, sequence by sequence, as
    word_to_indices maps them; all_data/ split here with the same seed gives the same federation."""
    written = _shakespeare_all_data(tmp_path)
    _split_like_leaf(tmp_path, by_user, seed=7)
    fed = load_leaf(str(tmp_path), "user" if by_user else "sample", seed=7)
    assert fed.num_classes == 80 and fed.train_x.dtype == np.int64
    train_files = sorted((tmp_path / "train").iterdir())
    test_files = sorted((tmp_path / "test").iterdir())
    train = [(u, d) for p in train_files for (u, d) in
             ((u, json.loads(p.read_text())["user_data"][u]) for u in json.loads(p.read_text())["users"])]
    test = {u: d for p in test_files for u, d in json.loads(p.read_text())["user_data"].items()}
    assert fed.client_ids == [u for u, _ in train]
    assert "HAMLET_ONE_LINE" not in fed.client_ids or by_user
    for k, (user, data) in enumerate(train):
        part = slice(fed.train_offsets[k], fed.train_offsets[k + 1])
        assert fed.train_x[part].tolist() == [[LEAF_LETTERS.find(c) for c in s] for s in data["x"]]
        assert fed.train_y[part].tolist() == [LEAF_LETTERS.find(c) for c in data["y"]]
        own = slice(fed.test_offsets[k], fed.test_offsets[k + 1])
        expected = test.get(user, {"x": [], "y": []}) if not by_user else {"x": [], "y": []}
        assert fed.test_y[own].tolist() == [LEAF_LETTERS.find(c) for c in expected["y"]]
    held = sum(len(d["y"]) for d in test.values())
    assert len(fed.test_y) == held
    if by_user:  # the test users are the test split, and no training client's
        assert not set(test) & set(fed.client_ids) and fed.test_offsets[-1] == 0
    # all_data/ alone, split here: the same federation
    only = tmp_path / "only_all"
    (only / "all_data").mkdir(parents=True)
    for p in (tmp_path / "all_data").iterdir():
        (only / "all_data" / p.name).write_text(p.read_text())
    here = load_leaf(str(only), "user" if by_user else "sample", seed=7)
    for a, b in ((fed.train_x, here.train_x), (fed.train_y, here.train_y), (fed.test_x, here.test_x),
                 (fed.test_y, here.test_y), (fed.train_offsets, here.train_offsets),
                 (fed.test_offsets, here.test_offsets)):
        np.testing.assert_array_equal(a, b)
    assert here.client_ids == fed.client_ids and set(written) >= set(fed.client_ids)


def test_femnist_images(tmp_path):
    """784 floats a sample are FEMNIST's 28 x 28 images (row-major, as LEAF flattens them), 62 classes."""
    rng = np.random.default_rng(1)
    users = ["f0000_14", "f0001_41", "f0002_07"]
    data = {u: {"x": rng.random((n, 784)).round(6).tolist(), "y": rng.integers(0, 62, n).tolist()}
            for u, n in zip(users, (5, 3, 4))}
    for which in ("train", "test"):
        _write(tmp_path / which / f"all_data_0_niid_0_keep_0_{which}_9.json", users,
               {u: {"x": d["x"][:2] if which == "test" else d["x"][2:],
                    "y": d["y"][:2] if which == "test" else d["y"][2:]} for u, d in data.items()})
    fed = load_leaf(str(tmp_path), "sample", 0)
    assert fed.num_classes == 62 and fed.train_x.shape == (6, 1, 28, 28) and fed.test_x.shape == (6, 1, 28, 28)
    np.testing.assert_array_equal(np.diff(fed.train_offsets), [3, 1, 2])
    np.testing.assert_array_equal(fed.train_x[0, 0], np.asarray(data[users[0]]["x"][2], dtype=np.float32).reshape(28, 28))
    np.testing.assert_array_equal(fed.test_y[4:6], data[users[2]]["y"][:2])


@pytest.mark.parametrize("damage, message", [
    (lambda d: d.pop("num_samples"), "lacks num_samples"),
    (lambda d: d["user_data"]["u1"]["x"].append([0.5, 0.5, 0.5]), "has 3 x and 2 y but num_samples says 2"),
    (lambda d: d["user_data"]["u1"].update(x=[[0.1, 0.2, 0.3], [0.1, 0.2]]), "ragged or mixed rows"),
    (lambda d: d["user_data"]["u1"].update(y=["a", "b"]), "y must be class numbers"),
    (lambda d: d["user_data"].pop("u1"), "user_data has no {x, y} for user 'u1'"),
    (lambda d: d.update(users=5), "users must be a list of user ids (strings, the keys of user_data), got 5"),
    (lambda d: d.update(users=[["u0"], "u1"]), "users must be a list of user ids (strings, the keys of user_data), "
                                                "got ['u0']"),
    (lambda d: d.update(user_data=[1, 2]), "user_data must map each user id to its {x, y}, got list"),
    (lambda d: d.update(num_samples="22"), "num_samples must be a list of sample counts"),
    (lambda d: d["user_data"]["u1"].update(x=5), "user 'u1': x and y must be lists of samples, got int and list"),
    (lambda d: d.update(users=["u0", "u0"]), "lists user 'u0' twice in users"),
    # JSON's Infinity and 1e300 would be int64's minimum as labels, 1e39 float32's inf as an input
    (lambda d: d["user_data"]["u1"].update(y=[1, float("inf")]), "user 'u1', sample 1: label inf is not a class"),
    (lambda d: d["user_data"]["u1"].update(y=[1e300, 1]), "user 'u1', sample 0: label 1e+300 is not a class"),
    (lambda d: d["user_data"]["u1"].update(x=[[0.1, 0.2, 0.3], [0.1, 1e39, 0.3]]),
     "user 'u1', sample 1: x holds 1e+39, beyond float32's range"),
    (lambda d: d["user_data"]["u1"].update(x=[[0.1, 0.2, 0.3], [0.1, 10**400, 0.3]]),
     "user 'u1': x holds an integer beyond float's range"),
])
def test_malformed_files_are_refused_in_one_line(tmp_path, damage, message):
    data = {"users": ["u0", "u1"], "num_samples": [2, 2],
            "user_data": {"u0": {"x": [[0.1, 0.2, 0.3]] * 2, "y": [0, 1]}, "u1": {"x": [[0.3, 0.2, 0.1]] * 2, "y": [1, 2]}}}
    damage(data)
    for which in ("train", "test"):
        (tmp_path / which).mkdir()
        (tmp_path / which / "d.json").write_text(json.dumps(data))
    with pytest.raises(DataError, match=".*") as info:
        load_leaf(str(tmp_path), "sample", 0)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(tmp_path / "train" / "d.json") in str(info.value)


def test_deep_nesting_is_refused_naming_the_file(tmp_path):
    for which in ("train", "test"):
        (tmp_path / which).mkdir()
        (tmp_path / which / "d.json").write_text('{"users": ["u0"], "num_samples": [1], "user_data": {"u0": '
                                                 '{"x": [%s], "y": [0]}}}' % ("[" * 100_000 + "]" * 100_000))
    with pytest.raises(DataError, match=".*") as info:
        load_leaf(str(tmp_path), "sample", 0)
    assert f"data.path: {tmp_path / 'train' / 'd.json'} nests its values thousands of levels deep" in str(info.value)


def test_a_user_in_two_files_of_a_folder_is_refused(tmp_path):
    """LEAF writes each user into one file of a folder; listed in two it would become two clients."""
    entry = {"x": [[0.1, 0.2]] * 2, "y": [0, 1]}
    for which in ("train", "test"):
        for name in ("a.json", "b.json"):
            _write(tmp_path / which / name, ["u0", "f" + name[0]], {"u0": entry, "f" + name[0]: entry})
    with pytest.raises(DataError, match=".*") as info:
        load_leaf(str(tmp_path), "sample", 0)
    assert str(info.value) == (f"data.path: user 'u0' is listed in both {tmp_path / 'train' / 'a.json'} and "
                               f"{tmp_path / 'train' / 'b.json'}; each LEAF user is one client, in one file of a folder")


def test_models_match_leafs_shapes():
    from distfl.models import build_model
    from distfl.config.schema import ModelConfig

    torch.manual_seed(0)
    cnn = build_model(ModelConfig(name="femnist_cnn"), (1, 28, 28), 62)
    assert sum(p.numel() for p in cnn.parameters()) == 6_603_710  # LEAF's TF model: the same layers
    assert cnn(torch.rand(2, 1, 28, 28)).shape == (2, 62)
    lstm = build_model(ModelConfig(name="char_lstm"), (80,), 80)
    assert sum(p.numel() for p in lstm.parameters()) == 817_872  # 80x8 + (8+256)x1024+1024 + 512x1024+1024 + 256x80+80
    x = torch.randint(0, 80, (3, 80))
    assert lstm(x).shape == (3, 80)


def test_lstm_cell_equations_match_torch_lstm():
    """The written-out LSTM is nn.LSTM's recurrence with TF's forget bias of 1 (checked by loading the
    same weights into nn.LSTM with 1 added to its forget-gate bias)."""
    from distfl.models.char_lstm import CellLSTM

    torch.manual_seed(0)
    ours = CellLSTM(8, 16, 2)
    ref = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
    with torch.no_grad():
        for k in range(2):
            getattr(ref, f"weight_ih_l{k}").copy_(ours.input_maps[k].weight)
            getattr(ref, f"weight_hh_l{k}").copy_(ours.hidden_maps[k].weight)
            bias = ours.input_maps[k].bias.clone()
            bias[16:32] += 1.0  # gate order i, f, g, o
            getattr(ref, f"bias_ih_l{k}").copy_(bias)
            getattr(ref, f"bias_hh_l{k}").zero_()
    x = torch.randn(4, 7, 8)
    torch.testing.assert_close(ours(x), ref(x)[0][:, -1], rtol=1e-5, atol=1e-6)


def test_lstm_one_rank_two_ranks_resumed(tmp_path):
    _shakespeare_all_data(tmp_path / "leaf", length=12, seed=3)
    cfg = write_config(tmp_path / "leaf.yaml", {
        "seed": 2,
        "data": {"dataset": "leaf", "path": str(tmp_path / "leaf"), "leaf_split": "sample"},
        "partition": {"scheme": "natural", "num_clients": 4},
        "model": {"name": "char_lstm"},
        "train": {"rounds": 4, "clients_per_round": 3, "lr": 0.5, "batch_size": 4},
        "eval": {"every": 2, "clients": True},
        "checkpoint": {"every": 1, "keep": 5},
        "output": {"progress": "none", "tensorboard": False},
    })
    one, _, _ = one_two_resumed(cfg, tmp_path, stop_at=2, rounds=4)
    assert one["final_test_acc"] is not None


def test_natural_client_count_is_checked(tmp_path):
    _shakespeare_all_data(tmp_path / "leaf", length=12)
    cfg = write_config(tmp_path / "leaf.yaml", {
        "data": {"dataset": "leaf", "path": str(tmp_path / "leaf")},
        "partition": {"scheme": "natural", "num_clients": 9},
        "model": {"name": "char_lstm"},
        "train": {"rounds": 1, "clients_per_round": 2},
        "output": {"dir": str(tmp_path / "run"), "progress": "none", "tensorboard": False}})
    proc = run_cli(["train", str(cfg)])
    assert proc.returncode != 0
    assert "the dataset holds 4 clients but partition.num_clients=9; set partition.num_clients=4" in proc.stderr


def test_image_transforms_are_refused_on_characters(tmp_path):
    from distfl.data.datasets import load_dataset
    from distfl.config.schema import DataConfig

    _shakespeare_all_data(tmp_path / "leaf", length=12)
    for key, value in (("normalize", "mean_std"), ("augment", "crop_flip")):
        cfg = DataConfig(dataset="leaf", path=str(tmp_path / "leaf"), **{key: value})
        with pytest.raises(DataError, match=f"data.{key}={value} scales or crops images, but leaf-characters"):
            load_dataset(cfg, 0)


def test_per_client_evaluation_needs_clients_with_test_samples(tmp_path):
    """A user-wise split gives no training client a test sample of its own: eval.clients is refused in one
    line (and eval.client_split=holdout works)."""
    _shakespeare_all_data(tmp_path / "leaf", length=12)
    cfg = write_config(tmp_path / "c.yaml", {
        "data": {"dataset": "leaf", "path": str(tmp_path / "leaf"), "leaf_split": "user"},
        "partition": {"scheme": "natural", "num_clients": 4}, "model": {"name": "char_lstm"},
        "train": {"rounds": 1, "clients_per_round": 2, "batch_size": 4}, "eval": {"every": 1, "clients": True},
        "output": {"dir": str(tmp_path / "run"), "progress": "none", "tensorboard": False}})
    proc = run_cli(["train", str(cfg)])
    assert proc.returncode != 0 and "no client of this natural split has any" in proc.stderr, proc.stderr
    ok = run_cli(["train", str(cfg), "eval.client_split=holdout", f"output.dir={tmp_path / 'held'}"])
    assert ok.returncode == 0, ok.stderr


def test_lstm_trains_in_packs_as_one_at_a_time(tmp_path):
    """char_lstm is written as cell equations so torch.func vectorises it: a round in packs of 2 gives the
    model of one client at a time, up to float rounding."""
    _shakespeare_all_data(tmp_path / "leaf", length=12)
    cfg = write_config(tmp_path / "c.yaml", {
        "data": {"dataset": "leaf", "path": str(tmp_path / "leaf")}, "partition": {"scheme": "natural", "num_clients": 4},
        "model": {"name": "char_lstm"}, "train": {"rounds": 1, "clients_per_round": 4, "batch_size": 4, "lr": 0.5},
        "output": {"progress": "none", "tensorboard": False}})
    assert_packs_train_as_one_at_a_time(cfg, tmp_path, 2)


def test_clients_csv_names_each_client_by_its_leaf_user(tmp_path):
    """eval.clients writes RUN_DIR/clients.csv: each client's LEAF user name, samples and accuracy at the
    last evaluation, equal to the statistics that evaluation logged."""
    import csv

    from conftest import metrics
    from distfl.federation.client_eval import accuracy_statistics

    _shakespeare_all_data(tmp_path / "leaf", length=12)
    cfg = write_config(tmp_path / "c.yaml", {
        "data": {"dataset": "leaf", "path": str(tmp_path / "leaf")}, "partition": {"scheme": "natural", "num_clients": 4},
        "model": {"name": "char_lstm"}, "train": {"rounds": 2, "clients_per_round": 2, "batch_size": 4},
        "eval": {"every": 1, "clients": True},
        "output": {"dir": str(tmp_path / "run"), "progress": "none", "tensorboard": False}})
    proc = run_cli(["train", str(cfg)])
    assert proc.returncode == 0, proc.stderr
    fed = load_leaf(str(tmp_path / "leaf"), "sample", 3)
    with open(tmp_path / "run" / "clients.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["client_id"] for r in rows] == list(fed.client_ids) and len(rows) == 4
    assert [int(r["train_samples"]) for r in rows] == list(np.diff(fed.train_offsets))
    assert [int(r["test_samples"]) for r in rows] == list(np.diff(fed.test_offsets))
    last = metrics(tmp_path / "run")[-1]
    found = accuracy_statistics([int(r["correct"]) for r in rows], [int(r["test_samples"]) for r in rows])
    assert found == {k: last[k] for k in found} and {r["round"] for r in rows} == {"2"}

"""A user's own data, split and model are checked before any work: files whose bytes changed since a run
started refuse its resume; bad inputs, labels and partition files, and models that do not fit the data, are
refused with one line saying what is wrong, and no run directory is written."""
from __future__ import annotations

import hashlib
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import metrics, run_cli, summary, train_ok, write_config

N_TRAIN, N_TEST, CLASSES = 60, 20, 4


def arrays(seed: int = 0) -> dict:
    """A small learnable npz dataset: 2 x 3 x 3 images around one mean per class; every class in both splits."""
    rng = np.random.RandomState(seed)
    means = rng.rand(CLASSES, 2, 3, 3).astype(np.float32)

    def split(n):
        y = np.arange(n) % CLASSES
        rng.shuffle(y)
        return (means[y] + 0.3 * rng.randn(n, 2, 3, 3)).astype(np.float32), y.astype(np.int64)

    (x_train, y_train), (x_test, y_test) = split(N_TRAIN), split(N_TEST)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def write_split(path: Path, order: np.ndarray, sizes) -> None:
    np.savez(path, **{f"client_{i}": p.astype(np.int64) for i, p in enumerate(np.split(order, np.cumsum(sizes)[:-1]))})


def files_config(tmp_path: Path, data: Path, split: Path | None = None, **sections) -> Path:
    part = ({"scheme": "file", "path": str(split), "num_clients": 4} if split is not None
            else {"scheme": "iid", "num_clients": 4})
    sections = {"model": {"name": "mlp", "mlp_hidden": 16}, **sections}
    return write_config(tmp_path / "files.yaml", data={"dataset": "files", "path": str(data)}, partition=part,
                        train={"rounds": 4, "clients_per_round": 3, "lr": 0.1, "batch_size": 8},
                        eval={"every": 2}, checkpoint={"every": 1, "keep": 5}, **sections)


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# ---------------------------------------------------------------- 1. data files cannot change under a resume


@pytest.fixture
def stopped_run(tmp_path):
    """A files-dataset run with a partition file, stopped after its round-2 checkpoint, and the same run
    uninterrupted."""
    np.savez(tmp_path / "data.npz", **arrays())
    write_split(tmp_path / "split.npz", np.random.RandomState(1).permutation(N_TRAIN), [10, 14, 17, 19])
    config = files_config(tmp_path, tmp_path / "data.npz", tmp_path / "split.npz")
    whole = train_ok(config, f"output.dir={tmp_path / 'whole'}")
    train_ok(config, f"output.dir={tmp_path / 'run'}", "train.rounds=2")
    return config, tmp_path / "run", whole


def assert_resume_refused(run_dir: Path, role: str, path: Path, before: str) -> None:
    rows = metrics(run_dir)
    proc = run_cli(["train", "--resume", run_dir, "train.rounds=4"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1
    assert f"cannot resume {run_dir}: {role} {path} changed since the run started" in line
    assert f"SHA-256 {before} when checkpointed, {sha(path)} now" in line
    assert metrics(run_dir) == rows and summary(run_dir)["rounds"] == 2  # nothing trained, nothing written


def test_resume_refuses_a_rewritten_npz(stopped_run, tmp_path):
    config, run_dir, _ = stopped_run
    before = sha(tmp_path / "data.npz")
    assert summary(run_dir)["data_files"]["data.path"] == {"path": str(tmp_path / "data.npz"), "sha256": before}
    data = arrays()
    data["x_train"] = data["x_train"][::-1].copy()  # same shapes, same labels: only the bytes tell
    np.savez(tmp_path / "data.npz", **data)
    assert_resume_refused(run_dir, "data.path", tmp_path / "data.npz", before)


def test_resume_refuses_a_regenerated_partition_file(stopped_run, tmp_path):
    config, run_dir, _ = stopped_run
    before = sha(tmp_path / "split.npz")
    write_split(tmp_path / "split.npz", np.random.RandomState(2).permutation(N_TRAIN), [10, 14, 17, 19])
    assert_resume_refused(run_dir, "partition.path", tmp_path / "split.npz", before)


def test_resume_on_the_same_bytes_is_exact(stopped_run, tmp_path):
    config, run_dir, whole = stopped_run
    # Written again with the same arrays: the same bytes, so the resume goes on.
    np.savez(tmp_path / "data.npz", **arrays())
    resumed = train_ok(config, "train.rounds=4", resume=str(run_dir))
    assert resumed["model_sha256"] == whole["model_sha256"]
    assert [r["train_loss"] for r in metrics(run_dir)] == [r["train_loss"] for r in metrics(tmp_path / "whole")]


def test_a_sweep_does_not_resume_a_point_on_changed_data(tmp_path):
    np.savez(tmp_path / "data.npz", **arrays())
    config = files_config(tmp_path, tmp_path / "data.npz")
    sweep = ["sweep", config, f"output.dir={tmp_path / 'sweep'}", "--grid", "train.lr=0.1,0.05"]
    assert run_cli([*sweep, "train.rounds=2"]).returncode == 0
    data = arrays()
    data["x_train"] = data["x_train"][::-1].copy()
    np.savez(tmp_path / "data.npz", **data)
    proc = run_cli([*sweep, "train.rounds=4"])
    assert proc.returncode == 1
    assert proc.stdout.count("data.path " + str(tmp_path / "data.npz") + " changed since the run started") == 2
    for lr in ("0.1", "0.05"):
        assert summary(tmp_path / "sweep" / f"train.lr={lr}" / "seed=3")["rounds"] == 2


def test_the_fmnist_files_are_hashed_from_the_bytes_read():
    """Each of the four IDX files is recorded with the SHA-256 of its decompressed bytes (the bytes the
    loader already read). Its cost is measured by `distfl bench startup` ("dataset decode"), not here:
    no test asserts a time."""
    from distfl.data import datasets
    from distfl.config.schema import DataConfig

    try:
        datasets.find_fmnist("data")
    except Exception:
        pytest.skip("Fashion-MNIST not installed")
    ds = datasets.load_dataset(DataConfig(dataset="fmnist", root="data"), 0)
    assert sorted(ds.sources) == sorted(name[:-3] for name in datasets.FMNIST_FILES)
    for path, digest in ds.sources.values():
        import gzip

        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            assert hashlib.sha256(f.read()).hexdigest() == digest


# ---------------------------------------------------------------- 2. data refused before any work


def with_change(change) -> dict:
    data = arrays()
    change(data)
    return data


def _set(data, key, index, value):
    data[key] = data[key].copy()
    data[key][index] = value


BAD_DATA = {
    "x_test NaN": (lambda d: _set(d, "x_test", (5, 0, 1, 1), np.nan),
                   "x_test holds NaN or inf (beyond float32) in 1 of its 20 samples (the first is sample 5)"),
    "x_train inf": (lambda d: _set(d, "x_train", (7, 1, 0, 0), np.inf),
                    "x_train holds NaN or inf (beyond float32) in 1 of its 60 samples (the first is sample 7)"),
    "x_train beyond float32": (lambda d: d.update(x_train=d["x_train"].astype(np.float64) * np.where(
        np.arange(N_TRAIN) == 3, 1e300, 1.0)[:, None, None, None]), "in 1 of its 60 samples (the first is sample 3)"),
    "label 1000": (lambda d: _set(d, "y_train", 9, 1000),
                   "y_train's labels run up to 1000 (sample 9), but 996 of the classes 0..1000 have no training "
                   "sample (the first is 4)"),
    "label 2^40": (lambda d: _set(d, "y_train", 9, 2**40),  # counted per class, it asked for 8 TiB
                   f"y_train's labels run up to {2**40} (sample 9), but {2**40 + 1 - 5} of the classes 0..{2**40} "
                   "have no training sample (the first is 4)"),
    "test label unseen": (lambda d: (_set(d, "y_train", d["y_train"] == 3, 2), _set(d, "y_test", 4, 3)),
                          "that no y_train sample has; the model cannot learn a class it never sees"),
    "negative label": (lambda d: _set(d, "y_test", 2, -1), "y_test holds the negative label -1 (sample 2)"),
    "short x_test": (lambda d: d.update(x_test=d["x_test"][:15]),
                     "x_test holds 15 samples but y_test has shape (20,); they must pair one to one"),
    "channels last": (lambda d: d.update(x_train=np.zeros((N_TRAIN, 28, 28, 1), np.float32),
                                         x_test=np.zeros((N_TEST, 28, 28, 1), np.float32)),
                      "x_train has shape (60, 28, 28, 1), which looks like N x H x W x C (channels last); distfl "
                      "expects images as N x C x H x W: save x_train.transpose(0, 3, 1, 2)"),
    "declared num_classes": (lambda d: (d.update(num_classes=np.array(4)), _set(d, "y_train", 0, 4)),
                             "y_train holds label 4 (sample 0), but the file declares num_classes=4"),
    "float labels": (lambda d: d.update(y_train=d["y_train"].astype(np.float32)),
                     "y_train must hold integer class labels, got float32"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_bad_data_refused_before_any_work(tmp_path, case):
    change, expected = BAD_DATA[case]
    np.savez(tmp_path / "data.npz", **with_change(change))
    proc = run_cli(["train", files_config(tmp_path, tmp_path / "data.npz"), f"output.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"distfl: error: data.path {tmp_path / 'data.npz'}: ")
    assert expected in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_declared_num_classes_allows_classes_without_training_samples(tmp_path):
    from distfl.data.datasets import load_dataset
    from distfl.config.schema import DataConfig

    data = arrays()
    data["y_train"] = np.where(data["y_train"] == 3, 5, data["y_train"])  # classes 0, 1, 2, 5 of 8
    data["y_test"] = np.where(data["y_test"] == 3, 5, data["y_test"])
    np.savez(tmp_path / "gaps.npz", **data)
    with pytest.raises(Exception, match="2 of the classes 0..5 have no training sample"):
        load_dataset(DataConfig(dataset="files", path=str(tmp_path / "gaps.npz")), 0)
    np.savez(tmp_path / "declared.npz", **data, num_classes=np.array(8))
    ds = load_dataset(DataConfig(dataset="files", path=str(tmp_path / "declared.npz")), 0)
    assert ds.num_classes == 8 and torch.equal(ds.train_y, torch.from_numpy(data["y_train"]))


def test_image_folder_test_classes_follow_the_training_folders(tmp_path):
    """A test/ tree lacking a class keeps the training tree's numbering (ImageFolder alone would renumber it),
    and a test class folder that train/ lacks is refused."""
    from PIL import Image

    from distfl.data.datasets import load_dataset
    from distfl.errors import DataError
    from distfl.config.schema import DataConfig

    for split, labels in (("train", ("ant", "bee", "cat")), ("test", ("ant", "cat"))):
        for label in labels:
            (tmp_path / "tree" / split / label).mkdir(parents=True)
            Image.fromarray(np.full((4, 4, 3), 10, dtype=np.uint8)).save(tmp_path / "tree" / split / label / "0.png")
    ds = load_dataset(DataConfig(dataset="files", path=str(tmp_path / "tree")), 0)
    assert ds.train_y.tolist() == [0, 1, 2] and ds.test_y.tolist() == [0, 2] and ds.num_classes == 3
    (tmp_path / "tree" / "test" / "dog").mkdir()
    Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / "tree" / "test" / "dog" / "0.png")
    with pytest.raises(DataError, match="test/ has class folder.s. dog that train/ lacks"):
        load_dataset(DataConfig(dataset="files", path=str(tmp_path / "tree")), 0)


BAD_SPLITS = {
    "half the samples": (lambda order: [order[:8], order[8:15], order[15:22], order[22:30]],
                         "the clients hold 30 of the 60 training samples (30 in no client, the first is index"),
    "an index in two clients": (lambda order: [order[:16], np.r_[order[15:30], order[15]][:-1], order[30:45], order[45:]],
                                "is in both client_0 and client_1"),
    "an index twice in one client": (lambda order: [np.r_[order[:15], order[0]], order[15:30], order[30:45], order[45:]],
                                     "client_0 holds index"),
    "an empty client": (lambda order: [order[:30], order[30:30], order[30:45], order[45:]],
                        "client_1 holds no index; every client of the file needs a sample: give client_1 indices, or "
                        "remove it (renumber the clients after it and set partition.num_clients=3)"),
}


@pytest.mark.parametrize("case", sorted(BAD_SPLITS))
def test_bad_partition_file_refused_before_any_work(tmp_path, case):
    cut, expected = BAD_SPLITS[case]
    np.savez(tmp_path / "data.npz", **arrays())
    order = np.random.RandomState(3).permutation(N_TRAIN)
    np.savez(tmp_path / "split.npz", **{f"client_{i}": p.astype(np.int64) for i, p in enumerate(cut(order))})
    proc = run_cli(["train", files_config(tmp_path, tmp_path / "data.npz", tmp_path / "split.npz"),
                    f"output.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"distfl: error: partition.path {tmp_path / 'split.npz'}: ")
    assert expected in proc.stderr and "another scheme" not in proc.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- 3. one-sample last batches under BatchNorm


def test_batch_sizes_fold_a_single_last_sample_only_with_batchnorm():
    from distfl.federation.local import FlatModel, batch_sizes, local_steps, pass_sizes

    assert pass_sizes(17, 8) == [8, 8, 1] and pass_sizes(17, 8, fold_single=True) == [8, 9]
    assert pass_sizes(18, 8, fold_single=True) == [8, 8, 2]
    assert pass_sizes(9, 8, fold_single=True) == [9] and pass_sizes(1, 8, fold_single=True) == [1]
    assert local_steps(17, 8, 2, fold_single=True) == 4
    assert batch_sizes(17, 8, 1, steps=5, fold_single=True) == [8, 9, 8, 9, 8]
    bn = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    assert FlatModel(bn).fold_single and not FlatModel(torch.nn.Sequential(torch.nn.Linear(3, 2))).fold_single


def test_local_batches_fold_draws_every_sample_once_per_pass():
    from types import SimpleNamespace

    from distfl.federation.local import local_batches

    data = SimpleNamespace(train_x=torch.arange(40.0)[:, None], train_y=torch.arange(40), augment=None)
    indices = torch.arange(3, 20)  # 17 samples
    cfg = SimpleNamespace(batch_size=8, local_epochs=2, local_steps=0)
    torch.manual_seed(0)
    plain = [y for _, y in local_batches(data, indices, cfg)]
    torch.manual_seed(0)
    folded = [y for _, y in local_batches(data, indices, cfg, fold_single=True)]
    assert [len(y) for y in plain] == [8, 8, 1] * 2 and [len(y) for y in folded] == [8, 9] * 2
    # The same random order per pass: folding only moves the lone last sample into the batch before it.
    assert torch.equal(torch.cat(plain), torch.cat(folded))
    assert sorted(torch.cat(folded[:2]).tolist()) == list(range(3, 20))


def test_single_sample_client_under_batchnorm_refused_before_any_work(tmp_path, bn_plugin):
    np.savez(tmp_path / "data.npz", **arrays())
    order = np.random.RandomState(3).permutation(N_TRAIN)
    write_split(tmp_path / "split.npz", order, [1, 19, 20, 20])
    config = files_config(tmp_path, tmp_path / "data.npz", tmp_path / "split.npz", model={"name": "bnlab:bn_model"})
    proc = run_cli(["train", config, f"output.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert ("client 0 holds a single training sample, and model.name=bnlab:bn_model cannot train on a batch of one "
            "(ValueError: Expected more than 1 value per channel") in proc.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- 4. models that do not fit the data

BN_PLUGIN = '''
import distfl
import torch
from torch import nn


def bn_model(input_shape, num_classes):
    c, h, w = input_shape
    return nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, num_classes))


def wrong_in_features(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(40, 8), nn.ReLU(), nn.Linear(8, num_classes))


def wrong_feature_dim(input_shape, num_classes):
    return distfl.Classifier(nn.Sequential(nn.Flatten(), nn.Linear(18, 12), nn.ReLU()), 10, num_classes)


class Pair(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(18, 8)

    def forward(self, x):
        h = self.fc(x.flatten(1))
        return h, h.norm(dim=1)


def tuple_features(input_shape, num_classes):
    return distfl.Classifier(Pair(), 8, num_classes)


class FailsInTraining(nn.Module):
    def forward(self, x):
        if self.training:
            raise RuntimeError("this layer breaks in training")
        return x.flatten(1)


def fails_in_training(input_shape, num_classes):
    return nn.Sequential(FailsInTraining(), nn.Linear(18, num_classes))
'''


@pytest.fixture
def bn_plugin(tmp_path):
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "bnlab.py").write_text(BN_PLUGIN)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop("bnlab", None)


@pytest.mark.parametrize("model,expected", [
    ("wrong_in_features", "model.name=bnlab:wrong_in_features does not fit the data (inputs C x H x W = (2, 3, 3), 4 "
                          "classes): its features fail on a batch of shape (2, 2, 3, 3): RuntimeError: mat1 and mat2 "
                          "shapes cannot be multiplied (2x18 and 40x8)"),
    ("wrong_feature_dim", "its features map a batch of shape (2, 2, 3, 3) to shape (2, 12), but feature_dim is 10"),
    ("tuple_features", "its features return tuple, not one tensor"),
])
def test_model_that_does_not_fit_the_data_refused_before_any_work(tmp_path, bn_plugin, model, expected):
    np.savez(tmp_path / "data.npz", **arrays())
    config = files_config(tmp_path, tmp_path / "data.npz", model={"name": f"bnlab:{model}"})
    proc = run_cli(["train", config, f"output.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(f"distfl: error: model.name=bnlab:{model} does not fit the data (inputs C x H x W "
                                  "= (2, 3, 3), 4 classes): ") and expected in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_a_run_that_failed_before_its_first_checkpoint_says_to_start_over(tmp_path, bn_plugin):
    """The retry of a run that failed in round 1 is told to start over (there is nothing to resume), and
    a resume of a run that holds no checkpoint names no placeholder."""
    np.savez(tmp_path / "data.npz", **arrays())
    config = files_config(tmp_path, tmp_path / "data.npz", model={"name": "bnlab:fails_in_training"})
    first = run_cli(["train", config, f"output.dir={tmp_path / 'run'}"])
    assert first.returncode == 1 and "this layer breaks in training" in first.stderr
    again = run_cli(["train", config, f"output.dir={tmp_path / 'run'}"])
    assert again.returncode == 2
    assert (f"output.dir {tmp_path / 'run'} already holds a run; it stopped before its first checkpoint, so there is "
            "nothing to resume: start it over with --overwrite") in again.stderr
    assert "continue it with" not in again.stderr

    from distfl.checkpoint import newest_good
    from distfl.errors import CheckpointError

    with pytest.raises(CheckpointError) as info:
        newest_good(tmp_path / "run", torch.device("cpu"))
    assert "LABEL_STEP" not in str(info.value)
    assert f"start the run over with `distfl train {tmp_path / 'run' / 'config.yaml'} --overwrite`" in str(info.value)


@pytest.mark.parametrize("content, expected", [
    (b"x_train,y_train\n0.5,1\n", "it is a text file, not an .npz (zip) archive of arrays (it begins 'x_train,y_train')"),
    (pickle.dumps({"x_train": [1.0]}), "it holds pickled Python objects, which distfl never loads"),
])
def test_a_file_that_is_no_npz_is_called_what_it_is(tmp_path, content, expected):
    """np.load takes any file that is neither a zip nor an .npy for a pickle ("This file contains
    pickled (object) data"); the message says what the file is instead."""
    (tmp_path / "data.npz").write_bytes(content)
    proc = run_cli(["train", files_config(tmp_path, tmp_path / "data.npz"), f"output.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"distfl: error: cannot read data.path {tmp_path / 'data.npz'} as an .npz file: "
                                  f"{expected}"), proc.stderr
    assert "x_train=..., y_train=..., x_test=..., y_test=..." in proc.stderr and "pickled (object)" not in proc.stderr

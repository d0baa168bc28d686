"""FedProx's synthetic federations (data.dataset=fedprox_synthetic), their natural partition and the
multinomial logistic regression: the generator against a transcription of the authors' scripts, the
clients and their own test splits in a run, and 1 rank == 2 ranks == resumed."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from conftest import build_trainer, metrics, one_two_resumed, run_cli, write_config
from distfl.data.fedprox_synthetic import generate, load_fedprox_synthetic

# ---- an independent transcription of the authors' generators (litian96/FedProx: data/synthetic_*/
# generate_synthetic.py for Synthetic(alpha, beta), data/synthetic_iid/generate_iid.py for the IID one,
# with `np.random.seed(seed); random.seed(seed)` first: their scripts seed neither), statement by statement.


def _softmax(x):
    ex = np.exp(x)
    sum_ex = np.sum(np.exp(x))
    return ex / sum_ex


def _authors_generate(alpha, beta, iid):
    num_user, dimension, num_class = 30, 60, 10
    samples_per_user = np.random.lognormal(4, 2, (num_user)).astype(int) + 50
    x_split = [[] for _ in range(num_user)]
    y_split = [[] for _ in range(num_user)]
    diagonal = np.zeros(dimension)
    for j in range(dimension):
        diagonal[j] = np.power((j + 1), -1.2)
    cov_x = np.diag(diagonal)
    if iid:  # generate_iid.py
        mean_x = np.zeros((num_user, dimension))
        w = np.random.normal(0, 1, (dimension, num_class))
        b = np.random.normal(0, 1, num_class)
        drawn = {"mean_W": np.zeros(num_user), "B": np.zeros(num_user), "mean_x": mean_x}
        for i in range(num_user):
            xx = np.random.multivariate_normal(mean_x[i], cov_x, samples_per_user[i])
            yy = np.zeros(samples_per_user[i])
            for j in range(samples_per_user[i]):
                yy[j] = np.argmax(_softmax(np.dot(xx[j], w) + b))
            x_split[i], y_split[i] = xx.tolist(), yy.tolist()
    else:  # generate_synthetic.py with iid=0
        mean_w = np.random.normal(0, alpha, num_user)
        mean_b = mean_w
        big_b = np.random.normal(0, beta, num_user)
        mean_x = np.zeros((num_user, dimension))
        for i in range(num_user):
            mean_x[i] = np.random.normal(big_b[i], 1, dimension)
        drawn = {"mean_W": mean_w, "B": big_b, "mean_x": mean_x}
        for i in range(num_user):
            w = np.random.normal(mean_w[i], 1, (dimension, num_class))
            b = np.random.normal(mean_b[i], 1, num_class)
            xx = np.random.multivariate_normal(mean_x[i], cov_x, samples_per_user[i])
            yy = np.zeros(samples_per_user[i])
            for j in range(samples_per_user[i]):
                yy[j] = np.argmax(_softmax(np.dot(xx[j], w) + b))
            x_split[i], y_split[i] = xx.tolist(), yy.tolist()
    return x_split, y_split, samples_per_user, drawn


def _authors_federation(alpha, beta, iid, seed):
    """The scripts' main(): generate, then per user shuffle and split 90/10 (their train/test JSON)."""
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        np.random.seed(seed)
        random.seed(seed)
        x, y, sizes, drawn = _authors_generate(alpha, beta, iid)
        train, test = [], []
        for i in range(30):
            combined = list(zip(x[i], y[i]))
            random.shuffle(combined)
            x[i][:], y[i][:] = zip(*combined)
            train_len = int(0.9 * len(x[i]))
            train.append({"x": x[i][:train_len], "y": y[i][:train_len]})
            test.append({"x": x[i][train_len:], "y": y[i][train_len:]})
        return train, test, sizes, drawn
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


@pytest.mark.parametrize("alpha, beta, iid, seed", [(0.0, 0.0, False, 0), (0.5, 0.5, False, 1), (1.0, 1.0, False, 2),
                                                    (0.0, 0.0, True, 3)])
def test_federation_is_the_authors_draw(alpha, beta, iid, seed):
    """Every device's size, split, features (as float32) and labels, and the drawn per-device model means
    u_k, feature shifts B_k and feature means v_k, equal the authors' scripts' for that seed."""
    train, test, sizes, drawn = _authors_federation(alpha, beta, iid, seed)
    fed = load_fedprox_synthetic(alpha, beta, iid, seed)
    assert fed.num_clients == 30 and fed.num_classes == 10 and fed.train_x.shape[1:] == (1, 1, 60)
    np.testing.assert_array_equal(np.diff(fed.train_offsets), [len(t["y"]) for t in train])
    np.testing.assert_array_equal(np.diff(fed.test_offsets), [len(t["y"]) for t in test])
    for k in range(30):
        for split, ours_x, ours_y, offsets in (
                (train, fed.train_x, fed.train_y, fed.train_offsets), (test, fed.test_x, fed.test_y, fed.test_offsets)):
            part = slice(offsets[k], offsets[k + 1])
            np.testing.assert_array_equal(ours_x[part].reshape(-1, 60), np.asarray(split[k]["x"], dtype=np.float32))
            np.testing.assert_array_equal(ours_y[part], np.asarray(split[k]["y"]).astype(np.int64))
    ours = generate(alpha, beta, iid, seed)
    np.testing.assert_array_equal(ours.sizes, sizes)
    np.testing.assert_array_equal(ours.model_means, drawn["mean_W"])
    np.testing.assert_array_equal(ours.feature_shift, drawn["B"])
    np.testing.assert_array_equal(ours.feature_means, drawn["mean_x"])


def test_statistics_of_the_draws():
    """What the paper's Section 5.1 describes, on the drawn numbers: sizes floor(lognormal(4, 2)) + 50 (so
    at least 50, a heavy tail); u_k ~ N(0, alpha), B_k ~ N(0, beta), v_k ~ N(B_k, 1); and for alpha =
    beta = 0 all devices share u = B = 0 while their feature means still differ (v_k ~ N(0, 1))."""
    seeds = range(6)
    feds = {s: generate(1.0, 1.0, False, s) for s in seeds}
    log_excess = np.concatenate([np.log(f.sizes - 49) for f in feds.values()])  # floor(L) + 1 > 0
    assert (np.concatenate([f.sizes for f in feds.values()]) >= 50).all()
    assert abs(np.median(log_excess) - 4.0) < 0.6  # median of log L is 4; 180 draws
    u = np.concatenate([f.model_means for f in feds.values()])
    b = np.concatenate([f.feature_shift for f in feds.values()])
    v_minus_b = np.concatenate([(f.feature_means - f.feature_shift[:, None]).ravel() for f in feds.values()])
    assert 0.8 < u.std() < 1.2 and 0.8 < b.std() < 1.2  # 180 draws each of N(0, 1)
    assert abs(v_minus_b.mean()) < 0.05 and abs(v_minus_b.std() - 1) < 0.05  # 10,800 draws of N(0, 1)
    zero = generate(0.0, 0.0, False, 0)
    assert not zero.model_means.any() and not zero.feature_shift.any()
    assert 0.8 < zero.feature_means.std() < 1.2
    iid = generate(0.0, 0.0, True, 0)
    assert not iid.feature_means.any()


SYNTH = {
    "seed": 5,
    "data": {"dataset": "fedprox_synthetic", "synthetic_alpha": 1.0, "synthetic_beta": 1.0},
    "partition": {"scheme": "natural", "num_clients": 30, "seed": 1},
    "model": {"name": "mclr"},
    "algorithm": {"name": "fedprox", "mu": 1.0},
    "train": {"rounds": 6, "clients_per_round": 5, "lr": 0.01, "batch_size": 10},
    "eval": {"every": 2, "train_metrics": True, "clients": True},
    "checkpoint": {"every": 2, "keep": 5},
    "output": {"progress": "none", "tensorboard": False},
}


def test_one_rank_two_ranks_resumed(tmp_path):
    cfg = write_config(tmp_path / "synth.yaml", SYNTH)
    one, _, _ = one_two_resumed(cfg, tmp_path)
    rows = {name: [(r.get("global_train_loss"), r.get("client_acc_mean")) for r in metrics(tmp_path / name)]
            for name in ("one", "two")}
    assert rows["one"] == rows["two"] and rows["one"][1][0] is not None


def test_run_trains_each_device_on_its_own_samples(tmp_path):
    """In a run, client k's training samples are device k's training split and its local test set is
    device k's test split; the global model's training loss is its mean loss over all training samples."""
    cfg_path = write_config(tmp_path / "synth.yaml", SYNTH)
    fed = load_fedprox_synthetic(1.0, 1.0, False, 1)
    trainer = build_trainer(cfg_path, tmp_path / "run")
    try:
        for k in range(30):
            x = trainer.data.train_x[trainer.client_indices[k]]
            np.testing.assert_array_equal(x.numpy(), fed.train_x[fed.train_offsets[k]:fed.train_offsets[k + 1]])
            test = trainer.client_test_x[trainer.client_test[k]]
            np.testing.assert_array_equal(test.numpy(), fed.test_x[fed.test_offsets[k]:fed.test_offsets[k + 1]])
        metrics_ = trainer.evaluate_round(clients=False)
        model = trainer.worker.module
        with torch.no_grad():
            logits = model(torch.from_numpy(fed.train_x))
            loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(fed.train_y)).item()
            acc = (logits.argmax(1) == torch.from_numpy(fed.train_y)).double().mean().item()
        assert metrics_["global_train_loss"] == pytest.approx(loss, rel=1e-6)
        assert metrics_["global_train_acc"] == pytest.approx(acc, abs=1e-12)
    finally:
        trainer.close()


def test_mclr_is_one_dense_layer_glorot_zero_bias():
    from distfl.models import build_model
    from distfl.config.schema import ModelConfig

    torch.manual_seed(0)
    model = build_model(ModelConfig(name="mclr"), (1, 1, 60), 10)
    assert sum(p.numel() for p in model.parameters()) == 610
    assert not model.head.bias.any()
    bound = (6 / (60 + 10)) ** 0.5
    assert model.head.weight.abs().max() <= bound and model.head.weight.abs().max() > 0.9 * bound
    x = torch.randn(4, 1, 1, 60)
    torch.testing.assert_close(model(x), x.flatten(1) @ model.head.weight.T, rtol=0, atol=0)


@pytest.mark.parametrize("overrides, message", [
    (["partition.num_clients=20"], "data.dataset=fedprox_synthetic has 30 devices but partition.num_clients=20; set "
                                   "partition.num_clients=30"),
    (["data.dataset=synthetic", "partition.num_clients=30"], "partition.scheme=natural gives each client the samples "
                                                              "the dataset assigns it, but data.dataset=synthetic"),
    (["data.synthetic_alpha=-1"], "data.synthetic_alpha must be"),
])
def test_refusals_name_the_key(tmp_path, overrides, message):
    cfg = write_config(tmp_path / "synth.yaml", SYNTH, output={"dir": str(tmp_path / "run")})
    proc = run_cli(["train", str(cfg), *overrides])
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()

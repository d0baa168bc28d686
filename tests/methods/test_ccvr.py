"""CCVR (Luo et al. 2021): the server's Gaussians from the clients' per-class statistics, summed over ranks."""
from __future__ import annotations


import numpy as np
import pytest
import torch

from conftest import metrics, run_cli, summary, train_ok, trained_model, write_config
from distfl.algorithms.ccvr import (STATS_FILE, class_gaussians, class_statistics, client_features, client_terms,
                                    retrain_head, sample_seed, sample_virtual, virtual_counts)
from distfl.checkpoint import complete_checkpoints, load


def paper_equations(stats):
    """Eqs. 3 and 4 of the paper, term by term, in numpy: stats is [(N_{c,k}, mu_{c,k}, Sigma_{c,k}), ...] for one
    class over the clients k that hold it."""
    n_c = sum(n for n, _, _ in stats)
    mu = sum(n / n_c * m for n, m, _ in stats)
    sigma = (sum((n - 1) / (n_c - 1) * s for n, _, s in stats)
             + sum(n / (n_c - 1) * np.outer(m, m) for n, m, _ in stats)
             - n_c / (n_c - 1) * np.outer(mu, mu))
    return mu, sigma


def test_global_gaussians_are_the_pooled_mean_and_covariance():
    """The identity the paper's Eq. 4 rests on: from the clients' means and unbiased covariances, the server
    recovers exactly the mean and unbiased covariance of all clients' features pooled. Client 2 holds one
    sample of class 1 (covariance undefined, weight N - 1 = 0) and none of class 2."""
    rng = np.random.default_rng(0)
    d, classes = 5, 3
    labels = [np.array([0] * 7 + [1] * 4 + [2] * 9), np.array([0] * 3 + [1] * 12 + [2] * 2), np.array([0] * 5 + [1])]
    features = [rng.normal(loc=3.0 * k, scale=1.0 + k, size=(len(y), d)) for k, y in enumerate(labels)]
    per_client = [class_statistics(torch.from_numpy(z), torch.from_numpy(y), classes) for z, y in zip(features, labels)]
    terms = [client_terms(*s) for s in per_client]
    counts = sum(s[0] for s in per_client)
    means, covs = class_gaussians(counts, sum(t[0] for t in terms), sum(t[1] for t in terms))
    pooled_z, pooled_y = np.concatenate(features), np.concatenate(labels)
    for c in range(classes):
        zc = pooled_z[pooled_y == c]
        direct_mean, direct_cov = zc.mean(0), np.cov(zc, rowvar=False, ddof=1)
        held = [(int(n[c]), m[c].numpy(), s[c].numpy()) for n, m, s in per_client if int(n[c]) > 0]
        mu, sigma = paper_equations(held)
        np.testing.assert_allclose(mu, direct_mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(sigma, direct_cov, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(means[c].numpy(), direct_mean, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(covs[c].numpy(), direct_cov, rtol=1e-10, atol=1e-12)
    assert counts.tolist() == [15, 17, 11]


def test_virtual_counts_equal_and_proportional():
    counts = torch.tensor([600, 300, 100, 0])
    assert virtual_counts(counts, 10, "equal") == [10, 10, 10, 0]
    # round(C M N_c / N) = round(4 * 10 * [0.6, 0.3, 0.1, 0]) = [24, 12, 4, 0]
    assert virtual_counts(counts, 10, "proportional") == [24, 12, 4, 0]
    assert virtual_counts(torch.tensor([1, 3]), 1, "proportional") == [1, 2]  # 0.5 and 1.5 round half up


def test_virtual_features_follow_the_fitted_gaussian():
    """Drawn through the eigendecomposition: the sample covariance of many draws approaches Sigma_c (a wrong
    square root would not), also for a singular Sigma_c, whose draws stay in its support."""
    rng = np.random.default_rng(1)
    a = rng.normal(size=(6, 3))
    singular = torch.from_numpy(a @ a.T)  # rank 3 of 6
    full = torch.from_numpy(np.cov(rng.normal(size=(50, 6)) * [1, 2, 3, 4, 5, 6], rowvar=False))
    means = torch.tensor([[1.0] * 6, [-2.0] * 6], dtype=torch.float64)
    x, y = sample_virtual(means, torch.stack([singular, full]), [20000, 20000], torch.Generator().manual_seed(0))
    assert y.tolist() == [0] * 20000 + [1] * 20000
    for c, cov in enumerate([singular, full]):
        drawn = x[y == c]
        assert float((drawn.mean(0) - means[c]).abs().max()) < 0.1
        assert float(torch.linalg.norm(torch.cov(drawn.t()) - cov) / torch.linalg.norm(cov)) < 0.05
    null = torch.linalg.eigh(singular)[1][:, :3]  # the directions of eigenvalue ~0
    assert float(((x[y == 0] - means[0]) @ null).abs().max()) < 1e-6


CONFIG = {"calibration": {"method": "ccvr", "virtual_samples": 50, "retrain_epochs": 3},
          "checkpoint": {"every": 0, "keep": 3}}


def test_two_ranks_equal_one_and_the_gaussians_are_the_pooled_features(tmp_path):
    """Two gloo ranks sum the clients' statistics in one all_reduce: the same Gaussians, virtual features and
    head, bit for bit, as one rank; the Gaussians are the mean and covariance of the trained model's features
    on all training data pooled; the installed head is the retraining of the trained head on those draws."""
    config = write_config(tmp_path / "c.yaml", **CONFIG)
    two = train_ok(config, f"output.dir={tmp_path / 'two'}", nproc=2)
    one = train_ok(config, f"output.dir={tmp_path / 'one'}")
    assert one["model_sha256"] == two["model_sha256"]
    saved_one, saved_two = torch.load(tmp_path / "one" / STATS_FILE), torch.load(tmp_path / "two" / STATS_FILE)
    for key in ("counts", "means", "covs"):
        assert torch.equal(saved_one[key], saved_two[key])
    ccvr = two["phases"]["ccvr"]
    assert two["world_size"] == 2 and two["collectives"]["calls"]["ccvr"] == 1
    assert ccvr["clients"] == 12 and ccvr["virtual_features"] == 50 * ccvr["classes_seen"]
    assert two["final_test_acc"] == ccvr["test_acc"]
    assert ccvr["test_acc_before"] == metrics(tmp_path / "two")[-2]["test_acc"]

    cfg, data, model, flat = trained_model(tmp_path / "two")
    z = client_features(model, data.train_x, 1000)
    assert ccvr["samples"] == len(z) == len(data.train_y)
    for c in range(data.num_classes):
        zc = z[data.train_y == c]
        assert int(saved_two["counts"][c]) == len(zc)
        # The sums travel at a unit of 2^-40: measured differences below 1e-13.
        torch.testing.assert_close(saved_two["means"][c], zc.mean(0), rtol=1e-9, atol=1e-11)
        torch.testing.assert_close(saved_two["covs"][c], torch.cov(zc.t()), rtol=1e-9, atol=1e-11)

    generator = torch.Generator().manual_seed(sample_seed(cfg.seed))
    x, y = sample_virtual(saved_two["means"], saved_two["covs"], saved_two["virtual"], generator)
    head = flat.param_slices
    trained_w = flat.params[head["head.weight"]].view(data.num_classes, -1).clone()
    weight, bias, _ = retrain_head(model, trained_w, flat.params[head["head.bias"]].clone(), x, y,
                                   cfg.calibration, generator)
    final = load(complete_checkpoints(tmp_path / "two")[-1], "cpu")["params"]
    assert torch.equal(final[head["head.weight"]], weight.reshape(-1))
    assert torch.equal(final[head["head.bias"]], bias)
    assert not torch.equal(weight, trained_w)
    body = torch.ones_like(final, dtype=torch.bool)
    body[head["head.weight"]] = body[head["head.bias"]] = False
    assert torch.equal(final[body], flat.params[body])  # the feature extractor is frozen


def test_crash_during_ccvr_resumes_without_retraining(tmp_path, monkeypatch):
    config = write_config(tmp_path / "c.yaml", **CONFIG)
    through = train_ok(config, f"output.dir={tmp_path / 'through'}")
    import distfl.algorithms.ccvr as ccvr

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash in the retraining")

    monkeypatch.setattr(ccvr, "retrain_head", crash)
    crashed = run_cli(["train", config, f"output.dir={tmp_path / 'crashed'}"])
    assert crashed.returncode == 1 and "simulated crash" in crashed.stderr
    monkeypatch.undo()
    proc = run_cli(["train", "--resume", tmp_path / "crashed"])
    assert proc.returncode == 0, proc.stderr
    resumed = summary(tmp_path / "crashed")
    assert resumed["model_sha256"] == through["model_sha256"]
    assert resumed["collectives"]["calls"].get("round_stats", 0) == 0  # no training round was rerun


def test_calibrating_a_finished_run_equals_calibrating_in_it(tmp_path):
    config = write_config(tmp_path / "c.yaml", **CONFIG)
    within = train_ok(config, f"output.dir={tmp_path / 'within'}")
    train_ok(config, f"output.dir={tmp_path / 'later'}", "calibration.method=none")
    later = train_ok(config, "calibration.method=ccvr", resume=str(tmp_path / "later"))
    assert later["model_sha256"] == within["model_sha256"]
    untimed = [{k: v for k, v in run["phases"]["ccvr"].items() if not k.endswith("_s")} for run in (later, within)]
    assert untimed[0] == untimed[1]



def test_distfl_calibrate_ccvr_equals_resuming_with_ccvr(tmp_path):
    """`distfl calibrate RUN --method ccvr KEY=VALUE` is `distfl train --resume RUN calibration.method=ccvr
    KEY=VALUE`, bit for bit: the calibrated model, the phase's result, its statistics file and every metrics row."""
    config = write_config(tmp_path / "c.yaml", **CONFIG)
    for name in ("resumed", "calibrated"):
        train_ok(config, f"output.dir={tmp_path / name}", "calibration.method=none")
    settings = ["calibration.virtual_samples=30", "calibration.retrain_lr=0.05"]
    resumed = train_ok(config, "calibration.method=ccvr", *settings, resume=str(tmp_path / "resumed"))
    proc = run_cli(["calibrate", tmp_path / "calibrated", "--method", "ccvr", *settings])
    assert proc.returncode == 0, proc.stderr
    calibrated = summary(tmp_path / "calibrated")
    assert calibrated["model_sha256"] == resumed["model_sha256"]
    assert calibrated["phases"]["ccvr"]["virtual_features"] == 300  # the setting reached the phase
    untimed = [{k: v for k, v in run["phases"]["ccvr"].items() if not k.endswith("_s")} for run in (calibrated, resumed)]
    assert untimed[0] == untimed[1]
    assert (tmp_path / "calibrated" / STATS_FILE).read_bytes() == (tmp_path / "resumed" / STATS_FILE).read_bytes()
    rows = [[{k: v for k, v in r.items() if not k.endswith("_s")} for r in metrics(tmp_path / name)]
            for name in ("calibrated", "resumed")]
    assert rows[0] == rows[1] and rows[0][-1]["phase"] == "ccvr"


def test_distfl_calibrate_ccvr_takes_only_the_ccvr_settings(tmp_path):
    run_dir = tmp_path / "run"
    train_ok(write_config(tmp_path / "c.yaml", **CONFIG), f"output.dir={run_dir}", "calibration.method=none")
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for item in ("calibration.ridge=0.1", "calibration.method=ffc", "train.rounds=5"):
        proc = run_cli(["calibrate", run_dir, "--method", "ccvr", "calibration.virtual_samples=30", item])
        assert proc.returncode == 2
        assert proc.stderr.strip() == (
            "distfl: error: distfl calibrate --method ccvr takes only the CCVR settings calibration.clients, "
            "calibration.batch_size, calibration.virtual_samples, calibration.virtual_allocation, "
            "calibration.retrain_epochs, calibration.retrain_lr, calibration.retrain_momentum, "
            f"calibration.retrain_batch_size; got {item}. To change other keys, continue the run: `distfl train "
            f"--resume {run_dir} calibration.method=ccvr KEY=VALUE`")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before

@pytest.mark.parametrize("override,message", [
    ("model.head=sphere", "calibration.method=ccvr retrains a learnable linear head"),
    ("calibration.virtual_allocation=balanced", "calibration.virtual_allocation"),
    ("calibration.virtual_samples=0", "calibration.virtual_samples"),
])
def test_ccvr_keys_are_validated_before_any_work(tmp_path, override, message):
    config = write_config(tmp_path / "c.yaml", calibration={"method": "ccvr"})
    proc = run_cli(["train", config, override, f"output.dir={tmp_path / 'r'}"])
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()

"""FedExP (docs/algorithms/fedexp.md): the step size recomputed from the clients' updates, FedAvg when it
is 1, evaluation on the mean of the last two global models, exactness across ranks and resume, refusals."""
from __future__ import annotations

import pytest
import torch

from conftest import build_trainer, metrics, one_two_resumed, record_client_models, run_cli, train_ok

EPS = 1e-3


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_step_size_is_the_formula_of_the_clients_updates(tmp_path, small_config, weighting):
    trainer = build_trainer(small_config, tmp_path / "run", "algorithm.name=fedexp", f"algorithm.weighting={weighting}")
    for t in (1, 2):
        start = trainer.global_params.clone()
        clients = record_client_models(trainer)
        trainer.run_round(t)
        deltas = [(params - start).double() for params, _ in clients]
        weights = [weight for _, weight in clients]
        mean = sum(p * d for p, d in zip(weights, deltas))
        if weighting == "uniform":  # the paper's form: sum_i ||Delta_i||^2 / (2 M (||Delta_bar||^2 + eps))
            M = len(deltas)
            ratio = sum(float(d @ d) for d in deltas) / (2 * M * (float(mean @ mean) + EPS))
        else:
            ratio = sum(p * float(d @ d) for p, d in zip(weights, deltas)) / (2 * (float(mean @ mean) + EPS))
        eta = max(1.0, ratio)
        assert ratio > 1.5  # extrapolating, not the FedAvg case
        assert trainer.algorithm.round_metrics["fedexp_eta_g"] == pytest.approx(eta, rel=1e-9)
        assert torch.allclose(trainer.global_params.double(), start.double() + eta * mean, rtol=0, atol=1e-6)


def test_evaluates_the_mean_of_the_last_two_global_models(tmp_path, small_config):
    trainer = build_trainer(small_config, tmp_path / "run", "algorithm.name=fedexp")
    trainer.run_round(1)
    first = trainer.global_params.clone()
    assert trainer.algorithm.evaluation_model(trainer.global_params, trainer.global_buffers)[0] is trainer.global_params
    trainer.run_round(2)
    mean = (trainer.global_params + first) / 2
    assert torch.equal(trainer.algorithm.evaluation_model(trainer.global_params, trainer.global_buffers)[0], mean)
    # What the run reports is that model's accuracy, not the last global model's.
    acc, _ = trainer.evaluate()
    model = trainer.worker.module
    for params, want in ((mean, acc), (trainer.global_params, None)):
        trainer.worker.load(params, trainer.global_buffers)
        with torch.no_grad():
            correct = int((model(trainer.data.test_x).argmax(1) == trainer.data.test_y).sum())
        if want is not None:
            assert correct / len(trainer.data.test_y) == want
        else:
            assert correct / len(trainer.data.test_y) != acc  # the two models score differently here


def test_step_size_one_is_fedavg(tmp_path, small_config):
    """One client a round: sum ||Delta||^2 / (2 (||Delta||^2 + eps)) < 1/2, so eta_g = 1 every round and
    the global model is FedAvg's, bit for bit."""
    fedavg = train_ok(small_config, f"output.dir={tmp_path / 'fedavg'}", "train.clients_per_round=1")
    fedexp = train_ok(small_config, f"output.dir={tmp_path / 'fedexp'}", "train.clients_per_round=1",
                      "algorithm.name=fedexp")
    assert {r["fedexp_eta_g"] for r in metrics(tmp_path / "fedexp")} == {1.0}
    assert fedexp["model_sha256"] == fedavg["model_sha256"]


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    """Same model, same step sizes and the same reported accuracy (the mean of the last two models: the
    previous one is checkpointed) on 1 rank, on 2 ranks, and stopped after round 4 then resumed on 2."""
    args = ["algorithm.name=fedexp", "server.momentum=0.5"]
    one_two_resumed(small_config, tmp_path, *args)
    etas = [r["fedexp_eta_g"] for r in metrics(tmp_path / "one")]
    assert max(etas) > 1
    assert etas == [r["fedexp_eta_g"] for r in metrics(tmp_path / "two")] == \
        [r["fedexp_eta_g"] for r in metrics(tmp_path / "stopped")]


def test_composes_with_gma_and_the_sphere_head(tmp_path, small_config):
    """GMA's mask on the extrapolated step, on SphereFed's fixed head: both act in every round."""
    args = ["algorithm.name=fedexp", "model.head=sphere"]
    masked = train_ok(small_config, f"output.dir={tmp_path / 'gma'}", *args, "aggregation.mask=gma")
    plain = train_ok(small_config, f"output.dir={tmp_path / 'plain'}", *args)
    rows = metrics(tmp_path / "gma")
    assert all(r["fedexp_eta_g"] >= 1 and r["gma/mean_mask"] < 1 for r in rows)
    assert masked["model_sha256"] != plain["model_sha256"]


@pytest.mark.parametrize("override,key", [("server.optimizer=adam", "server.optimizer=sgd"),
                                          ("calibration.method=ffc", "calibration.method=none")])
def test_refusals_come_before_any_work(tmp_path, small_config, override, key):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'r'}", "algorithm.name=fedexp", override])
    assert proc.returncode == 2 and key in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_under_fedbn_the_step_size_leaves_batchnorm_out(tmp_path):
    """FedBN: the server's BatchNorm is the mean of the clients' own, never a step, so eta_g is the formula
    over the other coordinates (recomputed here from the clients' models off the BatchNorm mask)."""
    from conftest import write_config

    config = write_config(tmp_path / "bn.yaml", model={"name": "resnet20"},
                          data={"synthetic_channels": 3, "synthetic_train": 240, "synthetic_test": 60},
                          partition={"num_clients": 4}, train={"rounds": 2, "clients_per_round": 4},
                          aggregation={"fedbn": True})
    trainer = build_trainer(config, tmp_path / "run", "algorithm.name=fedexp", "algorithm.weighting=uniform")
    shared = ~trainer.algorithm.bn_params
    for t in (1, 2):
        start = trainer.global_params.clone()
        clients = record_client_models(trainer)
        trainer.run_round(t)
        deltas = [(params - start)[shared].double() for params, _ in clients]
        mean = sum(deltas) / len(deltas)
        ratio = sum(float(d @ d) for d in deltas) / (2 * len(deltas) * (float(mean @ mean) + EPS))
        assert trainer.algorithm.round_metrics["fedexp_eta_g"] == pytest.approx(max(1.0, ratio), rel=1e-9)
        assert torch.allclose(trainer.global_params[shared].double(), start[shared].double() + max(1.0, ratio) * mean,
                              rtol=0, atol=1e-6)

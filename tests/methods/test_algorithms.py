"""Each method's maths, checked against its paper's formulas on small cases."""
import pytest
import torch

from conftest import build_trainer, train_ok, write_config
from distfl.algorithms.fednova import normaliser
from distfl.algorithms.fedopt import ServerOptimizer
from distfl.config.schema import ServerConfig


def _server_step(kind, updates, **kw):
    cfg = ServerConfig(optimizer=kind, **kw)
    opt = ServerOptimizer(cfg, 3, torch.device("cpu"))
    w = torch.zeros(3)
    for u in updates:
        opt.step(w, torch.tensor(u))
    return w


def test_server_sgd_is_fedavg_and_momentum_is_fedavgm():
    assert _server_step("sgd", [[1.0, -2.0, 0.5]], lr=1.0).tolist() == [1.0, -2.0, 0.5]
    w = _server_step("sgd", [[1.0, 0, 0], [1.0, 0, 0]], lr=0.5, momentum=0.9)
    assert w[0].item() == pytest.approx(0.5 * 1.0 + 0.5 * 1.9)


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_adaptive_server_optimizers_follow_reddi_et_al(kind):
    b1, b2, eps, lr = 0.9, 0.99, 1e-3, 0.1
    u1, u2 = torch.tensor([1.0, -0.5, 0.0]), torch.tensor([0.2, 0.3, -1.0])
    m = torch.zeros(3)
    v = torch.full((3,), eps**2)
    w = torch.zeros(3)
    for u in (u1, u2):
        m = b1 * m + (1 - b1) * u
        if kind == "adam":
            v = b2 * v + (1 - b2) * u**2
        elif kind == "yogi":
            v = v - (1 - b2) * u**2 * torch.sign(v - u**2)
        else:
            v = v + u**2
        w = w + lr * m / (v.sqrt() + eps)
    got = _server_step(kind, [u1.tolist(), u2.tolist()], lr=lr, beta1=b1, beta2=b2, eps=eps)
    assert torch.allclose(got, w, rtol=1e-6, atol=1e-7)


def test_fednova_normaliser():
    assert normaliser(7, 0.0) == 7.0
    rho, tau = 0.9, 5
    # a = sum_{j<tau} (1 - rho^(tau-j)) / (1 - rho): the total weight of tau momentum-SGD steps.
    expected = sum((1 - rho ** (tau - j)) / (1 - rho) for j in range(tau))
    assert normaliser(tau, rho) == pytest.approx(expected)


def test_fedprox_with_mu_zero_is_fedavg(tmp_path, small_config):
    a = train_ok(small_config, f"output.dir={tmp_path / 'a'}")
    b = train_ok(small_config, f"output.dir={tmp_path / 'b'}", "algorithm.name=fedprox", "algorithm.mu=0")
    assert a["model_sha256"] == b["model_sha256"]


def _round_updates(config, tmp_path, rounds=1, **algorithms):
    """Run `rounds` rounds in-process per named override list; return (trainer, initial params)."""
    out = {}
    for name, overrides in algorithms.items():
        trainer = build_trainer(config, tmp_path / name, *overrides)
        start = trainer.global_params.clone()
        for t in range(1, rounds + 1):
            trainer.run_round(t)
        out[name] = (trainer, start)
    return out


def test_fedprox_pulls_towards_the_global_model(tmp_path, small_config):
    runs = _round_updates(small_config, tmp_path, fedavg=[],
                          fedprox=["algorithm.name=fedprox", "algorithm.mu=5"])
    step = {k: (t.global_params - start).norm() for k, (t, start) in runs.items()}
    assert torch.equal(runs["fedavg"][1], runs["fedprox"][1])
    assert step["fedprox"] < 0.8 * step["fedavg"]


def test_fednova_with_equal_local_steps_is_fedavg(tmp_path):
    """iid over 2000 samples and 10 clients: every client takes the same number of steps."""
    cfg = write_config(tmp_path / "c.yaml", partition={"scheme": "iid", "num_clients": 10})
    runs = _round_updates(cfg, tmp_path, rounds=3, fedavg=[], fednova=["algorithm.name=fednova"])
    assert torch.allclose(runs["fedavg"][0].global_params, runs["fednova"][0].global_params, atol=1e-6)


def test_fednova_with_fixed_local_steps_is_fedavg_whatever_the_client_sizes(tmp_path, small_config):
    """train.local_steps gives every client of the Dirichlet split (unequal sizes) the same step count,
    so FedNova's normalisation is the identity again (the test below shows it is not under epochs)."""
    runs = _round_updates(small_config, tmp_path, fedavg=["train.local_steps=12"],
                          fednova=["algorithm.name=fednova", "train.local_steps=12"])
    assert torch.allclose(runs["fedavg"][0].global_params, runs["fednova"][0].global_params, atol=1e-6)


def test_fednova_normalises_unequal_local_work(tmp_path, small_config):
    """Under Dirichlet sizes clients take different step counts, and FedNova differs from FedAvg."""
    runs = _round_updates(small_config, tmp_path, fedavg=[], fednova=["algorithm.name=fednova"])
    assert not torch.allclose(runs["fedavg"][0].global_params, runs["fednova"][0].global_params, atol=1e-4)


def test_scaffold_server_control_is_the_mean_of_client_controls(tmp_path, small_config):
    """With c and every c_i starting at 0, c = (1/N) sum_i c_i after every round (Karimireddy et al.)."""
    trainer, _ = _round_updates(small_config, tmp_path, scaffold=["algorithm.name=scaffold"])["scaffold"]
    n = len(trainer.population)
    for t in range(2, 6):
        trainer.run_round(t)
        clients = [trainer.store.get(i, trainer.algorithm.init_client_state)["c"] for i in range(n)]
        mean = torch.stack(clients).double().mean(0)
        assert torch.allclose(trainer.algorithm.c.double(), mean, atol=1e-9)
        assert trainer.algorithm.c.abs().max() > 0

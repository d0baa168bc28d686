"""FedBN composed with every method: a client's BatchNorm is its own (docs/algorithms/fedbn.md)."""
from __future__ import annotations

import pytest
import torch

from conftest import build_trainer, write_config
from distfl.algorithms import ALGORITHMS
from distfl.federation.local import ClientRun

# Every registered method, GMA's mask and FedADC+'s distillation (whose teacher has BatchNorm too).
# Personalised methods keep their own model parts and refuse FedBN (tests/methods/test_personalised.py).
# TCT's rounds are its stage-1 method's (one of these), then a linear model without BatchNorm.
VARIANTS = {name: [f"algorithm.name={name}"] for name, cls in ALGORITHMS.items() if not cls.personalised and name != "tct"}
VARIANTS["fedavg+gma"] = ["aggregation.mask=gma"]
VARIANTS["fedadc+kd"] = ["algorithm.name=fedadc", "algorithm.kd_lambda=0.35"]
VARIANTS["scaffold+weights"] = ["algorithm.name=scaffold", "algorithm.scaffold_correction=weights", "train.momentum=0.9"]
VARIANTS["moon"].append("model.projection_dim=16")  # MOON needs a projection head


def _trainer(tmp_path, name, overrides):
    config = write_config(tmp_path / "bn.yaml", model={"name": "resnet20"},
                          data={"synthetic_channels": 3, "synthetic_train": 240, "synthetic_test": 60},
                          partition={"num_clients": 4}, train={"rounds": 2, "clients_per_round": 4},
                          aggregation={"fedbn": True})
    return build_trainer(config, tmp_path / name, *overrides)


def _record_clients(trainer) -> dict:
    """client id -> (trained parameters, trained buffers), recorded as each client's statistics are taken."""
    seen = {}
    inner = trainer.algorithm.client_statistics

    def recording(run, worker, stats):
        seen[run.client_id] = (worker.params.clone(), worker.buffers.clone())
        inner(run, worker, stats)

    trainer.algorithm.client_statistics = recording
    return seen


def _disturb_everything_but_own_batchnorm(trainer) -> None:
    """Change the global BatchNorm, and the BatchNorm coordinates of every server vector (momentum,
    W^{t-2}, controls, h) and of every client's method state (c_i, FedDyn's gradient)."""
    alg = trainer.algorithm
    bn, bn_buffers = alg.bn_params, alg.bn_buffers
    noise = torch.linspace(-0.7, 0.9, int(bn.sum()))
    trainer.global_params[bn] += noise
    trainer.global_buffers[bn_buffers] = trainer.global_buffers[bn_buffers] * 1.5 + 0.2
    vectors = [v for v in vars(alg.unwrapped()).values() if isinstance(v, torch.Tensor) and v.is_floating_point()
               and v.shape == bn.shape]
    vectors += [v for state in trainer.store._memory.values() for key, v in state.items()
                if key != "bn_params" and v.shape == bn.shape]
    assert vectors or alg.name in ("fedavg", "fednova", "fedprox", "fedlc", "fedntd")
    for v in vectors:
        v[bn] += noise


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_fedbn_client_batchnorm_is_its_own_under_every_method(tmp_path, variant):
    overrides = VARIANTS[variant]
    reference = _trainer(tmp_path, "ref", overrides)
    disturbed = _trainer(tmp_path, "dist", overrides)
    for trainer in (reference, disturbed):
        trainer.run_round(1)  # every client has its own BatchNorm; momentum, W^{t-2}, controls are set
    _disturb_everything_but_own_batchnorm(disturbed)
    trained = {}
    for key, trainer in (("ref", reference), ("dist", disturbed)):
        trained[key] = _record_clients(trainer)
        trainer.run_round(2)
    alg = reference.algorithm
    for client in range(4):
        (params, buffers), (params_d, buffers_d) = trained["ref"][client], trained["dist"][client]
        # Local training from the client's own BatchNorm on its own data: nothing the method or the
        # server holds on BatchNorm coordinates changes any bit of the client's model.
        assert torch.equal(params, params_d) and torch.equal(buffers, buffers_d), variant
        # Its state holds the BatchNorm it trained, and the next round starts from it.
        state = reference.store.get(client, dict)
        assert torch.equal(state["bn_params"], params[alg.bn_params])
        assert torch.equal(state["bn_buffers"], buffers[alg.bn_buffers])
    # The server's BatchNorm (for clients never sampled) is the weighted mean of the cohort's own.
    cohort = list(range(4))
    weights = [alg.client_weight(c, cohort) for c in cohort]
    mean_params = sum(w * trained["ref"][c][0][alg.bn_params].double() for c, w in zip(cohort, weights))
    mean_buffers = sum(w * trained["ref"][c][1][alg.bn_buffers].double() for c, w in zip(cohort, weights))
    torch.testing.assert_close(reference.global_params[alg.bn_params].double(), mean_params, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(reference.global_buffers[alg.bn_buffers].double(), mean_buffers, rtol=1e-6, atol=1e-7)


def test_fedbn_keeps_method_terms_off_batchnorm_but_not_off_the_rest(method_fixture):
    """The guard undoes FedProx's proximal term on BatchNorm coordinates only: elsewhere it still acts."""
    alg = method_fixture("algorithm.name=fedprox", "algorithm.mu=0.5", "aggregation.fedbn=true",
                         "model.name=resnet20", "data.synthetic_channels=3", input_shape=(3, 8, 8)).method
    n = alg.num_params
    run = ClientRun(0, 1, 10, 1.0, 1, torch.zeros(n))
    w, g = torch.ones(n), torch.full((n,), 2.0)
    alg.correct_gradient(w, g, run)
    assert torch.equal(g[alg.bn_params], torch.full((int(alg.bn_params.sum()),), 2.0))
    assert torch.equal(g[~alg.bn_params], torch.full((int((~alg.bn_params).sum()),), 2.5))

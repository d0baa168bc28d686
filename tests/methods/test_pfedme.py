"""pFedMe: a round recomputed from Algorithm 1 with plain nn.Modules (K inner steps on theta, then the
w step toward it; theta carried over within the round from the global model), the server's beta as
server.lr, each client scored with its theta, 1 rank == 2 ranks == stopped-and-resumed, refusals.
docs/algorithms/pfedme.md."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_refused
from test_personalised import (assert_clients_scored_with, personal_one_two_resumed, _flat, _initial_model,
                               _load_flat, _record, _trainer)


def test_a_round_recomputed_from_algorithm_1(tmp_path):
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    lam, plr, k, beta = 4.0, 0.05, 3, 1.5
    trainer = _trainer(tmp_path, "me", "algorithm.name=pfedme", f"algorithm.options.lam={lam}",
                       f"algorithm.options.personal_lr={plr}", f"algorithm.options.steps={k}", f"server.lr={beta}",
                       "eval.clients=true")
    cfg = trainer.cfg
    seen = _record(trainer)
    start = trainer.global_params.clone()
    trainer.run_round(1)
    cohort = trainer.population.cohort(cfg.seed, 1, cfg.train.clients_per_round)
    sizes = trainer.population.sizes
    mean = torch.zeros_like(start, dtype=torch.float64)
    thetas = {}
    for client in cohort:
        theta = _initial_model(trainer)
        _load_flat(theta, start)
        w = [p.detach().clone() for p in theta.parameters()]
        torch.manual_seed(client_seed(cfg.seed, 1, client))
        for x, y in local_batches(trainer.data, trainer.client_indices[client], cfg.train):
            for _ in range(k):
                theta.zero_grad(set_to_none=True)
                theta.loss(theta(x), y).backward()
                with torch.no_grad():
                    for p, wp in zip(theta.parameters(), w):
                        p.sub_(plr * (p.grad + lam * (p - wp)))
            with torch.no_grad():
                w = [wp - cfg.train.lr * lam * (wp - p) for p, wp in zip(theta.parameters(), w)]
        trained = torch.cat([wp.reshape(-1) for wp in w])
        assert torch.allclose(seen[1][client], trained, rtol=1e-4, atol=1e-6), client
        thetas[client] = _flat(theta)
        assert torch.allclose(trainer.store.peek(client)["theta"], thetas[client], rtol=1e-4, atol=1e-6)
        weight = float(sizes[client]) / float(sum(int(sizes[c]) for c in cohort))
        mean += weight * seen[1][client].double()
    # the server: (1 - beta) w^t + beta * mean(w_i)
    assert torch.allclose(trainer.global_params.double(), (1 - beta) * start.double() + beta * mean, atol=1e-5)


    def load(client, worker):
        state = trainer.store.peek(client)
        if state is not None:
            worker.params.copy_(state["theta"])

    got = assert_clients_scored_with(trainer, load)


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    # eta lam = 0.15 (the paper's eta is 0.005 at lam 15): the small config's lr 0.1 x 15 diverges
    one = personal_one_two_resumed(small_config, tmp_path, ["algorithm.name=pfedme", "eval.clients=true",
                                                            "algorithm.options.steps=2", "train.lr=0.01"], "theta")
    assert one["client_finetune_epochs"] == 0


@pytest.mark.parametrize("overrides, says", [
    (["model.name=resnet20", "data.synthetic_channels=3"], "BatchNorm"),
    (["algorithm.options.personal_lr=0.2", "algorithm.options.lam=10"], "personal_lr"),
    (["algorithm.options.steps=0"], "algorithm.options.steps"),
    (["runtime.pack_size=2", "runtime.client_state=disk"], "local_loss"),
])
def test_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", ["algorithm.name=pfedme", *overrides], says)

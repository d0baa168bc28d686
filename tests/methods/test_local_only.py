"""Local-only training (algorithm.name=local): each client's model is plain local SGD of its own model
from w^0 on its own batches, recomputed with an nn.Module loop; nothing is aggregated (the global model
stays w^0, the round's all_reduce carries no model); eval.clients scores each client's own model;
1 rank == 2 ranks == stopped-and-resumed. docs/algorithms/local.md."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_refused
from test_personalised import (assert_clients_scored_with, personal_one_two_resumed, _flat, _initial_model,
                               _plain_sgd, _trainer)


def test_each_clients_model_is_local_sgd_of_its_own_model_and_nothing_is_aggregated(tmp_path):
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    trainer = _trainer(tmp_path, "local", "algorithm.name=local", "eval.clients=true")
    cfg = trainer.cfg
    initial = trainer.global_params.clone()
    assert torch.equal(initial, _flat(_initial_model(trainer)))
    rounds = 4
    for t in range(1, rounds + 1):
        row = trainer.run_round(t)
        assert torch.equal(trainer.global_params, initial)  # the global model never moves
    assert row["bytes_reduced"] < 200  # counts only: no delta or buffers segment
    sampled = 0
    for client in range(len(trainer.population)):
        module = _initial_model(trainer)
        rounds_in = [t for t in range(1, rounds + 1)
                     if client in trainer.population.cohort(cfg.seed, t, cfg.train.clients_per_round)]
        for t in rounds_in:
            torch.manual_seed(client_seed(cfg.seed, t, client))
            _plain_sgd(module, local_batches(trainer.data, trainer.client_indices[client], cfg.train), cfg.train.lr)
        state = trainer.store.peek(client)
        if not rounds_in:
            assert state is None
            continue
        sampled += 1
        assert torch.equal(state["v"], _flat(module)), client
    assert sampled >= 8

    # eval.clients scores v_k, and w^0 for a client never sampled (counted as such)
    def load(client, worker):
        state = trainer.store.peek(client)
        if state is not None:
            worker.params.copy_(state["v"])

    got = assert_clients_scored_with(trainer, load)
    assert got["clients_never_sampled"] == len(trainer.population) - sampled


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    one = personal_one_two_resumed(small_config, tmp_path, ["algorithm.name=local", "eval.clients=true"], "v", two=["runtime.client_state=disk", "runtime.placement=balanced"])
    assert one["client_finetune_epochs"] == 0


@pytest.mark.parametrize("overrides, says", [
    (["aggregation.mask=gma"], "aggregation.mask=none"),
    (["model.head=sphere", "calibration.method=ffc"], "calibration.method=none"),
    (["aggregation.fedbn=true", "model.name=resnet20", "data.synthetic_channels=3"], "aggregation.fedbn=false"),
    (["eval.clients=true", "eval.finetune_epochs=2"], "is personalised"),
])
def test_compositions_that_make_no_sense_are_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", ["algorithm.name=local", *overrides], says)

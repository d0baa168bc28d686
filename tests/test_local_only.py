"""Local-only training (algorithm.name=local): each client's model is plain local SGD of its own model
from w^0 on its own batches, recomputed with an nn.Module loop; nothing is aggregated (the global model
stays w^0, the round's all_reduce carries no model); eval.clients scores each client's own model;
1 rank == 2 ranks == stopped-and-resumed. docs/algorithms/local.md."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_refused, metrics, train_ok
from test_personalised import (STATISTICS, _accuracies, _client_states, _flat, _initial_model, _plain_sgd,
                               _statistics, _trainer)


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
    got = trainer.evaluate_round(clients=True)

    def load(client, worker):
        state = trainer.store.peek(client)
        if state is not None:
            worker.params.copy_(state["v"])

    expected = _statistics(_accuracies(trainer, load))
    for key in STATISTICS:
        assert got[key] == pytest.approx(expected[key], rel=1e-12, abs=1e-15), key
    assert got["clients_never_sampled"] == len(trainer.population) - sampled
    assert expected != _statistics(_accuracies(trainer, lambda client, worker: None))


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    args = ["algorithm.name=local", "eval.clients=true"]
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", *args)
    two = train_ok(small_config, f"output.dir={tmp_path / 'two'}", *args, "runtime.client_state=disk",
                   "runtime.placement=balanced", nproc=2)
    train_ok(small_config, f"output.dir={tmp_path / 'res'}", *args, "train.rounds=4")
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "res"))
    runs = {"one": one, "two": two, "res": resumed}
    assert two["world_size"] == 2
    assert len({s["model_sha256"] for s in runs.values()}) == 1
    assert one["final_client_acc"] is not None and one["client_finetune_epochs"] == 0
    assert all(s["final_client_acc"] == one["final_client_acc"] for s in runs.values())
    keys = STATISTICS + ("test_acc", "train_loss", "clients_never_sampled")
    rows = {k: [{key: r.get(key) for key in keys} for r in metrics(tmp_path / k)] for k in ("one", "two")}
    assert rows["one"] == rows["two"]
    states = {k: _client_states(tmp_path / k) for k in runs}
    assert len(states["one"]) >= 6
    for k in ("two", "res"):
        assert states[k].keys() == states["one"].keys()
        for client, state in states["one"].items():
            assert all(torch.equal(state[key], states[k][client][key]) for key in state), (k, client)


@pytest.mark.parametrize("overrides, says", [
    (["aggregation.mask=gma"], "aggregation.mask=none"),
    (["model.head=sphere", "calibration.method=ffc"], "calibration.method=none"),
    (["aggregation.fedbn=true", "model.name=resnet20", "data.synthetic_channels=3"], "aggregation.fedbn=false"),
    (["eval.clients=true", "eval.finetune_epochs=2"], "is personalised"),
])
def test_compositions_that_make_no_sense_are_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", ["algorithm.name=local", *overrides], says)

"""FedALA: a returning client's round recomputed with plain tensors and nn.Modules (W learned on the ALA
passes' batches, clipped to [0, 1], the start phase's stopping rule (one loss a pass, as the authors'
ALA.py), theta^ on the head, then local SGD
from it), a first-time client is FedAvg's client, the per-client scores of theta^, 1 rank == 2 ranks ==
stopped-and-resumed, refusals. docs/algorithms/fedala.md."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import assert_refused
from test_personalised import (assert_clients_scored_with, personal_one_two_resumed, _flat, _head_mask,
                               _initial_model, _load_flat, _plain_sgd, _record, _trainer)


def _loss_and_grad(module, flat, x, y):
    _load_flat(module, flat)
    module.zero_grad(set_to_none=True)
    loss = module.loss(module(x), y)
    loss.backward()
    return float(loss.detach()), torch.cat([p.grad.reshape(-1) for p in module.parameters()])


def test_rounds_recomputed_and_scored_with_the_aggregated_model(tmp_path):
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    eta, frac, thr, pre, cap = 0.5, 0.5, 0.05, 2, 4
    trainer = _trainer(tmp_path, "ala", "algorithm.name=fedala", f"algorithm.options.eta={eta}",
                       f"algorithm.options.sample_fraction={frac}", f"algorithm.options.threshold={thr}",
                       f"algorithm.options.num_pre_loss={pre}", f"algorithm.options.start_passes={cap}",
                       "eval.clients=true")
    cfg, top = trainer.cfg, _head_mask(trainer)
    seen = _record(trainer)
    module = _initial_model(trainer)
    thetas, weights, started, returning = {}, {}, set(), 0
    for t in (1, 2, 3):
        start = trainer.global_params.clone()
        trainer.run_round(t)
        for client in trainer.population.cohort(cfg.seed, t, cfg.train.clients_per_round):
            torch.manual_seed(client_seed(cfg.seed, t, client))
            indices = trainer.client_indices[client]
            w = start.clone()
            if client in thetas:
                returning += 1
                theta_k, wk = thetas[client], weights.get(client, torch.ones(int(top.sum())))
                steps = math.ceil(len(indices) * frac / cfg.train.batch_size)
                losses = []
                for _ in range(1 if client in started else cap):
                    for x, y in local_batches(trainer.data, indices, cfg.train, steps=steps):
                        agg = start.clone()
                        agg[top] = theta_k[top] + (start[top] - theta_k[top]) * wk
                        loss, grad = _loss_and_grad(module, agg, x, y)
                        wk = (wk - eta * grad[top] * (start[top] - theta_k[top])).clamp(0, 1)
                    losses.append(loss)  # one a pass: its last batch's
                    if len(losses) > pre and np.std(losses[-pre:]) < thr:
                        break
                started.add(client)
                weights[client] = wk
                w[top] = theta_k[top] + (start[top] - theta_k[top]) * wk
            _load_flat(module, w)
            _plain_sgd(module, local_batches(trainer.data, indices, cfg.train), cfg.train.lr)
            thetas[client] = _flat(module)
            assert torch.allclose(seen[t][client], thetas[client], rtol=1e-4, atol=1e-6), (t, client)
            if client in weights:
                assert torch.allclose(trainer.store.peek(client)["W"], weights[client], atol=1e-6), (t, client)
    assert returning >= 3 and any(bool((wk < 1).any()) for wk in weights.values())

    def load(client, worker):
        state = trainer.store.peek(client)
        if state is not None and "W" in state:
            worker.params[top] = state["theta"][top] + (worker.params[top] - state["theta"][top]) * state["W"]

    assert_clients_scored_with(trainer, load)


@pytest.mark.parametrize("threshold, start_passes", [(1e9, 3), (0.0, 5)])
def test_start_phase_stops_by_the_losses_of_whole_passes(tmp_path, threshold, start_passes):
    """The authors' rule: one loss a pass (its last batch's); the start phase ends once more than
    num_pre_loss passes have run and the std of the last num_pre_loss is below the threshold (so a threshold
    no std reaches runs to start_passes, and one every std is below stops after num_pre_loss + 1 passes,
    however many batches a pass has); every later round takes one pass."""
    pre, cap, frac = 2, 5, 0.8
    trainer = _trainer(tmp_path, "ala", "algorithm.name=fedala", f"algorithm.options.threshold={threshold}",
                       f"algorithm.options.num_pre_loss={pre}", f"algorithm.options.start_passes={cap}",
                       f"algorithm.options.sample_fraction={frac}", "train.batch_size=4")
    batches, inner = {}, trainer.algorithm.local_loss

    def counting(model, x, y, run):
        if run.pass_name == "ala":
            batches[(run.round_idx, run.client_id)] = batches.get((run.round_idx, run.client_id), 0) + 1
        return inner(model, x, y, run)

    trainer.algorithm.local_loss = counting
    for t in range(1, 7):
        trainer.run_round(t)
    started, later = set(), 0
    for (t, client), count in sorted(batches.items()):
        steps = math.ceil(len(trainer.client_indices[client]) * frac / trainer.cfg.train.batch_size)
        assert steps > pre, "a pass must have more batches than num_pre_loss for the per-pass rule to show"
        later += client in started
        assert count == steps * (1 if client in started else start_passes), (t, client)
        started.add(client)
    assert len(started) >= 3 and later >= 2


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    one = personal_one_two_resumed(small_config, tmp_path, ["algorithm.name=fedala", "eval.clients=true",
                                                            "algorithm.options.start_passes=3"], "theta")
    assert one["client_finetune_epochs"] == 0


@pytest.mark.parametrize("overrides, says", [
    (["model.name=resnet20", "data.synthetic_channels=3"], "BatchNorm"),
    (["algorithm.options.sample_fraction=0"], "algorithm.options.sample_fraction"),
    (["model.head=fixed_random"], "model.head=fixed_random is fixed: use model.head=linear"),
])
def test_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", ["algorithm.name=fedala", *overrides], says)

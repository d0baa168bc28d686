"""FedRoD: a round recomputed with a plain nn.Module (body and generic head by SGD on the balanced softmax
loss, the personal head by SGD on the combined logits with the features detached), the personalised
model = the generic one with the personal head added, 1 rank == 2 ranks == stopped-and-resumed,
refusals. docs/algorithms/fedrod.md."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_refused
from test_personalised import (assert_clients_scored_with, personal_one_two_resumed, _flat, _head_mask,
                               _initial_model, _load_flat, _record, _trainer)


def test_a_round_recomputed_and_each_client_scored_with_both_heads(tmp_path):
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    trainer = _trainer(tmp_path, "rod", "algorithm.name=fedrod", "eval.clients=true")
    cfg, head = trainer.cfg, _head_mask(trainer)
    seen = _record(trainer)
    start = trainer.global_params.clone()
    trainer.run_round(1)
    cohort = trainer.population.cohort(cfg.seed, 1, cfg.train.clients_per_round)
    lacking = 0
    for client in cohort:
        counts = trainer.population.class_counts[client]
        lacking += int((counts == 0).any())
        log_prior = torch.log(torch.as_tensor(counts.astype(np.float64))).float()
        module = _initial_model(trainer)
        _load_flat(module, start)
        pw = torch.zeros_like(module.head.weight)
        pb = torch.zeros_like(module.head.bias)
        torch.manual_seed(client_seed(cfg.seed, 1, client))
        for x, y in local_batches(trainer.data, trainer.client_indices[client], cfg.train):
            module.zero_grad(set_to_none=True)
            z = module.features(x)
            g = module.head(z)
            # personal head: SGD on CE(g + p(z)) with g and z fixed
            pw_, pb_ = pw.clone().requires_grad_(), pb.clone().requires_grad_()
            F.cross_entropy(g.detach() + z.detach() @ pw_.T + pb_, y).backward()
            pw, pb = (pw - cfg.train.lr * pw_.grad).detach(), (pb - cfg.train.lr * pb_.grad).detach()
            F.cross_entropy(g + log_prior, y).backward()
            with torch.no_grad():
                for p in module.parameters():
                    p.add_(p.grad, alpha=-cfg.train.lr)
        assert torch.allclose(seen[1][client], _flat(module), rtol=1e-5, atol=1e-6), client
        assert torch.allclose(trainer.store.peek(client)["phead"], torch.cat([pw.reshape(-1), pb]), atol=1e-6)
    assert lacking  # the balanced softmax's -inf shift of missing classes is exercised


    def load(client, worker):
        state = trainer.store.peek(client)
        if state is not None:
            worker.params[head] += state["phead"]

    got = assert_clients_scored_with(trainer, load)


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    one = personal_one_two_resumed(small_config, tmp_path, ["algorithm.name=fedrod", "eval.clients=true"], "phead", two=["runtime.client_state=disk", "runtime.placement=balanced"])
    assert one["client_finetune_epochs"] == 0


@pytest.mark.parametrize("overrides, says", [
    (["model.head=sphere"], "model.head=linear"),
    (["model.head=fixed_random"], "model.head=fixed_random is fixed: use model.head=linear"),
    (["runtime.pack_size=2", "runtime.client_state=disk"], "local_loss"),
    (["eval.clients=true", "eval.finetune_epochs=2"], "is personalised"),
])
def test_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", ["algorithm.name=fedrod", *overrides], says)

"""LG-FedAvg: local bodies, a global head (or, global_layers=conv, global convolutional layers and local
fully connected ones). Two rounds recomputed with plain nn.Modules, both splits (each client from
its own local layers and the global ones; the head averaged by the clients' weights, the global body never
moving), eval.clients scoring (body_k, head^t), 1 rank == 2 ranks == stopped-and-resumed, refusals.
docs/algorithms/lgfedavg.md."""
from __future__ import annotations

import pytest
import torch

from conftest import assert_refused
from test_personalised import (assert_clients_scored_with, personal_one_two_resumed, _flat, _head_mask,
                               _initial_model, _load_flat, _plain_sgd, _record, _trainer)


def _conv_mask(trainer) -> torch.Tensor:
    """The flat coordinates of the model's Conv2d layers, read from the module's own layers."""
    module, mask = trainer.worker.module, torch.zeros(trainer.worker.num_params, dtype=torch.bool)
    conv = {f"{name}.{p}" for name, m in module.named_modules() if isinstance(m, torch.nn.Conv2d)
            for p in ("weight", "bias")}
    for name, where in trainer.worker.param_slices.items():
        mask[where] = name in conv
    return mask


@pytest.mark.parametrize("split", ["head", "conv"])
def test_two_rounds_recomputed_and_each_client_scored_with_its_own_body(tmp_path, split):
    """global_layers=head: the head averaged, the body local; conv (the authors' CNN split, on SimpleCNN):
    the convolutional layers averaged, the fully connected ones (head included) local. `head` below names
    the global coordinates, `~head` the client's own."""
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    model = ["model.name=simplecnn", "data.synthetic_image_size=16"] if split == "conv" else []
    trainer = _trainer(tmp_path, "lg", "algorithm.name=lgfedavg", "eval.clients=true",
                       f"algorithm.options.global_layers={split}", *model)
    cfg = trainer.cfg
    head = _head_mask(trainer) if split == "head" else _conv_mask(trainer)
    if split == "conv":
        assert 0 < int(head.sum()) < int((~head).sum()) and not bool((head & _head_mask(trainer)).any())
    initial = trainer.global_params.clone()
    seen = _record(trainer)
    bodies = {}
    for t in (1, 2):
        start = trainer.global_params.clone()
        trainer.run_round(t)
        cohort = trainer.population.cohort(cfg.seed, t, cfg.train.clients_per_round)
        sizes = trainer.population.sizes
        expected_head = start[head].double()
        for client in cohort:
            w = start.clone()
            if client in bodies:
                w[~head] = bodies[client]
            module = _initial_model(trainer)
            _load_flat(module, w)
            torch.manual_seed(client_seed(cfg.seed, t, client))
            _plain_sgd(module, local_batches(trainer.data, trainer.client_indices[client], cfg.train), cfg.train.lr)
            trained = _flat(module)
            assert torch.equal(seen[t][client], trained), (t, client)
            bodies[client] = trained[~head]
            weight = float(sizes[client]) / float(sum(int(sizes[c]) for c in cohort))
            expected_head += weight * (trained[head] - start[head]).double()
        assert torch.equal(trainer.global_params[~head], initial[~head])  # the global body never moves
        assert torch.allclose(trainer.global_params[head].double(), expected_head, atol=1e-6)
        assert not torch.equal(trainer.global_params[head], start[head])
    for client, body in bodies.items():
        assert torch.equal(trainer.store.peek(client)["body"], body)


    def load(client, worker):
        if client in bodies:
            worker.params[~head] = bodies[client]

    got = assert_clients_scored_with(trainer, load)


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    one = personal_one_two_resumed(small_config, tmp_path, ["algorithm.name=lgfedavg", "eval.clients=true"], "body")
    assert one["client_finetune_epochs"] == 0


@pytest.mark.parametrize("overrides, says", [
    (["model.name=resnet20", "data.synthetic_channels=3"], "BatchNorm"),
    (["model.head=fixed_random"], "use model.head=linear"),
    (["calibration.method=ffc"], "calibration.method=none"),
    (["eval.clients=true", "eval.finetune_epochs=2"], "is personalised"),
    (["algorithm.options.global_layers=conv"], "model.name=mlp has none"),
    (["algorithm.options.global_layers=fc"], "algorithm.options.global_layers"),
])
def test_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", ["algorithm.name=lgfedavg", *overrides], says)

"""FedProto: two rounds recomputed with plain nn.Modules at 1 and 2 local epochs and with local steps
(round 1: cross-entropy alone and the clients' prototypes from the last local epoch's features; the server's unweighted mean per class; round 2: cross-entropy +
lambda MSE to the global prototypes), lambda = 0 == local-only training bit for bit, 1 rank == 2 ranks ==
stopped-and-resumed (the global prototypes are server state). docs/algorithms/fedproto.md."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import metrics, train_ok
from test_personalised import (personal_one_two_resumed, _client_states, _flat, _initial_model, _load_flat,
                               _trainer)


def _train(module, batches, lr, protos=None, present=None, lam=0.0, num_classes=10, keep_from=0):
    """Plain SGD of CE(head(z)) + lam MSE(z, P[y]) (samples of classes without a prototype: 0); returns the
    mean feature per class over the batches from index keep_from on (features before each step) and which
    classes were seen there."""
    sums, counts = torch.zeros(num_classes, module.feature_dim), torch.zeros(num_classes)
    for b, (x, y) in enumerate(batches):
        module.zero_grad(set_to_none=True)
        z = module.features(x)
        loss = F.cross_entropy(module.head(z), y)
        for c in range(num_classes if b >= keep_from else 0):
            sums[c] += z.detach()[y == c].sum(0)
            counts[c] += int((y == c).sum())
        if present is not None and bool(present.any()):
            mask = present[y]
            diff = (z[mask] - protos[y[mask]]) ** 2
            loss = loss + lam * diff.sum() / z.numel()
        loss.backward()
        with torch.no_grad():
            for p in module.parameters():
                p.add_(p.grad, alpha=-lr)
    held = counts > 0
    return sums / counts.clamp_min(1).unsqueeze(1), held


@pytest.mark.parametrize("local", ["train.local_epochs=1", "train.local_epochs=2", "train.local_steps=7"])
def test_two_rounds_recomputed(tmp_path, local):
    """Each client's prototypes are its last local epoch's (the authors' code starts them afresh each
    epoch); with train.local_steps, the last epoch's worth of batches."""
    from distfl.federation.local import local_batches, pass_sizes
    from distfl.federation.population import client_seed

    lam = 0.5
    trainer = _trainer(tmp_path, "proto", "algorithm.name=fedproto", f"algorithm.options.lam={lam}", local)
    cfg, initial = trainer.cfg, trainer.global_params.clone()
    models, protos, present = {}, None, None
    for t in (1, 2):
        trainer.run_round(t)
        cohort = trainer.population.cohort(cfg.seed, t, cfg.train.clients_per_round)
        total = torch.zeros(10, trainer.worker.module.feature_dim)
        holders = torch.zeros(10)
        for client in cohort:
            module = _initial_model(trainer)
            _load_flat(module, models.get(client, initial))
            torch.manual_seed(client_seed(cfg.seed, t, client))
            batches = list(local_batches(trainer.data, trainer.client_indices[client], cfg.train))  # the MLP draws nothing more
            one_epoch = len(pass_sizes(len(trainer.client_indices[client]), cfg.train.batch_size))
            means, held = _train(module, batches, cfg.train.lr, protos, present, lam,
                                 keep_from=max(0, len(batches) - one_epoch))
            models[client] = _flat(module)
            assert torch.allclose(trainer.store.peek(client)["v"], models[client], rtol=1e-4, atol=1e-6), (t, client)
            total += torch.where(held.unsqueeze(1), means, 0.0)
            holders += held
        present = holders > 0
        protos = torch.where(present.unsqueeze(1), total / holders.clamp_min(1).unsqueeze(1), 0.0)
        assert torch.equal(trainer.algorithm.present, present)
        assert torch.allclose(trainer.algorithm.protos, protos, rtol=1e-4, atol=1e-5), t
        assert torch.equal(trainer.global_params, initial)  # no weights aggregated
    assert bool(present.any())


def test_lambda_zero_is_local_only_bit_for_bit(tmp_path, small_config):
    local = train_ok(small_config, f"output.dir={tmp_path / 'local'}", "algorithm.name=local", "eval.clients=true")
    proto = train_ok(small_config, f"output.dir={tmp_path / 'proto'}", "algorithm.name=fedproto",
                     "algorithm.options.lam=0", "eval.clients=true")
    on = train_ok(small_config, f"output.dir={tmp_path / 'on'}", "algorithm.name=fedproto", "eval.clients=true")
    assert local["final_client_acc"] == proto["final_client_acc"] != on["final_client_acc"]
    assert [r["train_loss"] for r in metrics(tmp_path / "local")] == [r["train_loss"] for r in metrics(tmp_path / "proto")]
    a, b = _client_states(tmp_path / "local"), _client_states(tmp_path / "proto")
    assert a.keys() == b.keys() and all(torch.equal(a[c]["v"], b[c]["v"]) for c in a)


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    one = personal_one_two_resumed(small_config, tmp_path, ["algorithm.name=fedproto", "eval.clients=true"], "v")
    assert one["client_finetune_epochs"] == 0

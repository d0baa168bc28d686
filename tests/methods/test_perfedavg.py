"""Per-FedAvg, FO and HF: one client's round recomputed with plain nn.Modules and torch.autograd.functional
(the inner step on D, the outer gradient on D', and for HF the Hessian-vector product on D''); the
personalised model is one step of size alpha from the global model; 1 rank == 2 ranks == stopped-and-
resumed; refusals. docs/algorithms/perfedavg.md."""
from __future__ import annotations

import copy

import pytest
import torch
from torch.autograd.functional import hvp

from conftest import assert_refused, one_two_resumed
from test_personalised import (assert_clients_scored_with, _initial_model, _record, _trainer)


def _loss_at(module, flat, x, y):
    """The model's loss with its parameters replaced by the flat vector `flat` (a function of `flat`)."""
    names = [n for n, _ in module.named_parameters()]
    shapes = [p.shape for _, p in module.named_parameters()]
    tensors, offset = {}, 0
    for n, shape in zip(names, shapes):
        count = shape.numel()
        tensors[n] = flat[offset : offset + count].view(shape)
        offset += count
    return module.loss(torch.func.functional_call(module, tensors, (x,)), y)


def _grad_at(module, flat, x, y):
    flat = flat.detach().requires_grad_()
    (g,) = torch.autograd.grad(_loss_at(module, flat, x, y), flat)
    return g


def _meta_step(module, w, x, y, alpha, beta, hf):
    """One Per-FedAvg step written from Algorithm 1 on the batch split into 2 (FO) or 3 (HF) parts."""
    k = 3 if hf else 2
    xs, ys = torch.tensor_split(x, k), torch.tensor_split(y, k)
    if len(y) < k:
        xs, ys = [x] * k, [y] * k
    tilde = w - alpha * _grad_at(module, w, xs[0], ys[0])
    v = _grad_at(module, tilde, xs[1], ys[1])
    if hf:
        _, hv = hvp(lambda f: _loss_at(module, f, xs[2], ys[2]), w.detach(), v)
        v = v - alpha * hv
    return w - beta * v


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_a_round_is_algorithm_1_recomputed(tmp_path, variant):
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    alpha = 0.05
    trainer = _trainer(tmp_path, "p", "algorithm.name=perfedavg", f"algorithm.options.variant={variant}",
                       f"algorithm.options.alpha={alpha}")
    cfg = trainer.cfg
    seen = _record(trainer)
    start = trainer.global_params.clone()
    trainer.run_round(1)
    module = _initial_model(trainer)
    cohort = trainer.population.cohort(cfg.seed, 1, cfg.train.clients_per_round)
    for client in cohort:
        w = start.clone()
        torch.manual_seed(client_seed(cfg.seed, 1, client))
        for x, y in local_batches(trainer.data, trainer.client_indices[client], cfg.train):
            w = _meta_step(module, w, x, y, alpha, cfg.train.lr, variant == "hf").detach()
        assert torch.allclose(seen[1][client], w, rtol=1e-4, atol=1e-6), client


def test_the_hf_step_differs_from_the_fo_step(tmp_path):
    """HF's second-order term and FO's inner step both move the result: HF != FO at alpha > 0, and FO at
    alpha > 0 != FO at alpha = 0."""
    runs = {}
    for variant, alpha in (("fo", 0.0), ("fo", 0.05), ("hf", 0.05)):
        trainer = _trainer(tmp_path, f"{variant}{alpha}", "algorithm.name=perfedavg",
                           f"algorithm.options.variant={variant}", f"algorithm.options.alpha={alpha}",
                           "train.batch_size=24")
        trainer.run_round(1)
        runs[variant, alpha] = trainer.global_params.clone()
    assert not torch.allclose(runs["fo", 0.05], runs["hf", 0.05], atol=1e-6)
    assert not torch.allclose(runs["fo", 0.0], runs["fo", 0.05], atol=1e-6)


def test_each_client_is_scored_after_one_alpha_step_from_the_global_model(tmp_path):
    from distfl.federation.client_eval import finetune_seed
    from distfl.federation.local import local_batches

    alpha = 0.2
    trainer = _trainer(tmp_path, "p", "algorithm.name=perfedavg", f"algorithm.options.alpha={alpha}",
                       "eval.clients=true")
    cfg = trainer.cfg
    trainer.run_round(1)
    module = _initial_model(trainer)

    def load(client, worker):
        torch.manual_seed(finetune_seed(cfg.seed, client))
        x, y = next(iter(local_batches(trainer.data, trainer.client_indices[client], cfg.train, steps=1)))
        worker.params.copy_(trainer.global_params - alpha * _grad_at(module, trainer.global_params, x, y))

    got = assert_clients_scored_with(trainer, load)


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config, variant):
    one, two, resumed = one_two_resumed(small_config, tmp_path, "algorithm.name=perfedavg", "eval.clients=true",
                                        f"algorithm.options.variant={variant}")
    assert one["final_client_acc"] == two["final_client_acc"] == resumed["final_client_acc"] is not None


@pytest.mark.parametrize("overrides, says", [
    (["model.name=resnet20", "data.synthetic_channels=3"], "BatchNorm"),
    (["algorithm.options.variant=so"], "algorithm.options.variant"),
    (["algorithm.options.alpha=-1"], "algorithm.options.alpha"),
    (["runtime.pack_size=2"], "local_loss"),
])
def test_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", ["algorithm.name=perfedavg", *overrides], says)

"""The method fixture (conftest.MethodFixture) tests a method's pieces without a run: its client runs train."""
from __future__ import annotations

import torch


def test_a_client_run_of_the_fixture_takes_the_methods_local_steps(method_fixture):
    """FedAvg, one full batch of the client's 8 samples: the worker ends at w - lr * grad of the mean loss,
    recomputed with torch.func on the same samples; the run's loss sum is that loss times 8."""
    from torch.func import functional_call, grad

    f = method_fixture("train.batch_size=8", "train.local_epochs=1", "train.lr=0.1")
    run = f.client_run(2)
    assert run.steps == 1
    f.train(run)
    model, (x, y) = f.worker.module, (f.data.train_x[16:24], f.data.train_y[16:24])
    names = list(f.worker.param_slices)
    start = {name: f.global_params[where].view_as(p) for (name, where), p in
             zip(f.worker.param_slices.items(), f.worker.param_tensors)}

    def loss(params):
        return model.loss(functional_call(model, params, (x,)), y)

    g = grad(loss)(start)
    expected = torch.cat([(start[n] - 0.1 * g[n]).reshape(-1) for n in names])
    torch.testing.assert_close(f.worker.params, expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(run.loss_sum, loss(start).double() * 8, rtol=1e-6, atol=0)


def test_a_method_hook_acts_in_the_fixtures_training(method_fixture):
    """FedProx's gradient term moves the second step: two steps with mu differ from two without, from the
    same client run; one step (where w = w_global) does not."""
    moved = {}
    for mu in (0.0, 1.0):
        for epochs in (1, 2):
            f = method_fixture("algorithm.name=fedprox", f"algorithm.options.mu={mu}", "train.batch_size=8",
                               f"train.local_epochs={epochs}")
            f.train(f.client_run(0))
            moved[mu, epochs] = f.worker.params.clone()
    assert torch.equal(moved[0.0, 1], moved[1.0, 1])
    assert not torch.equal(moved[0.0, 2], moved[1.0, 2])

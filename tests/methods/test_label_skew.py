"""FedLC (logit calibration) and FedNTD (not-true distillation): each paper's local loss recomputed
independently in float64, the method reducing to FedAvg bit for bit where the paper's parameter switches
it off (tau = 0, beta = 0), one client's round recomputed with a plain nn.Module, 1 rank == 2 ranks ==
stopped-and-resumed, and refusals before any work. docs/algorithms/fedlc.md, fedntd.md."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import assert_refused, metrics, one_two_resumed, run_cli, train_ok
from test_personalised import _flat, _initial_model, _load_flat, _record, _trainer


def _batch(trainer, client, size=16):
    idx = trainer.client_indices[client][:size]
    return trainer.data.train_x[idx], trainer.data.train_y[idx]


def _skewed_client(trainer) -> int:
    """A client that lacks some classes and holds others unequally (where the calibration matters)."""
    counts = trainer.population.class_counts
    return int(next(k for k in range(len(counts)) if (counts[k] == 0).any() and len(set(counts[k][counts[k] > 0])) > 1))


# ---- FedLC -----------------------------------------------------------------------------------------

def _fedlc_loss64(logits, y, counts, tau):
    """Eq. of the calibrated loss, in float64 with numpy: -log(e^{f_y - tau n_y^{-1/4}} / sum_c e^{f_c - tau n_c^{-1/4}})."""
    f = logits.detach().double().numpy()
    margin = tau * np.maximum(counts.astype(np.float64), 1e-8) ** -0.25
    z = f - margin
    z -= z.max(1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(1, keepdims=True))
    return float(-log_p[np.arange(len(y)), y.numpy()].mean())


def test_fedlc_local_loss_is_the_calibrated_cross_entropy(tmp_path):
    trainer = _trainer(tmp_path, "lc", "algorithm.name=fedlc", "algorithm.options.tau=2.0")
    client = _skewed_client(trainer)
    x, y = _batch(trainer, client)
    from distfl.federation.local import ClientRun

    run = ClientRun(client_id=client, round_idx=1, num_samples=1, weight=1.0, steps=1,
                    global_params=trainer.global_params)
    model = trainer.worker.module
    got = float(trainer.algorithm.local_loss(model, x, y, run).detach())
    counts = trainer.population.class_counts[client]
    assert got == pytest.approx(_fedlc_loss64(model(x), y, counts, 2.0), rel=1e-6)
    assert got != pytest.approx(_fedlc_loss64(model(x), y, counts, 0.0), rel=1e-3)  # the margins matter


def test_fedlc_round_recomputed_with_an_nn_module(tmp_path):
    """One round: each client's trained model is plain SGD of an nn.Module from w^0 on its batches of the
    loss written from the paper's formula (torch.exp / log, not F.cross_entropy)."""
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    tau = 1.5
    trainer = _trainer(tmp_path, "lc", "algorithm.name=fedlc", f"algorithm.options.tau={tau}")
    cfg = trainer.cfg
    seen = _record(trainer)
    trainer.run_round(1)
    cohort = trainer.population.cohort(cfg.seed, 1, cfg.train.clients_per_round)
    models = seen[1]
    assert sorted(models) == cohort
    for client in cohort:
        module = _initial_model(trainer)
        counts = torch.as_tensor(trainer.population.class_counts[client], dtype=torch.float64).clamp_min(1e-8)
        margin = (tau * counts ** -0.25).float()
        torch.manual_seed(client_seed(cfg.seed, 1, client))
        for xb, yb in local_batches(trainer.data, trainer.client_indices[client], cfg.train):
            module.zero_grad(set_to_none=True)
            cal = torch.exp(module(xb) - margin)
            loss = -torch.log(cal.gather(1, yb.unsqueeze(1)).squeeze(1) / cal.sum(1)).mean()
            loss.backward()
            with torch.no_grad():
                for p in module.parameters():
                    p.add_(p.grad, alpha=-cfg.train.lr)
        assert torch.allclose(models[client], _flat(module), rtol=1e-4, atol=1e-6), client


@pytest.mark.parametrize("method, off", [("fedlc", "algorithm.options.tau=0"), ("fedntd", "algorithm.options.beta=0")])
def test_switched_off_is_fedavg_bit_for_bit(tmp_path, small_config, method, off):
    avg = train_ok(small_config, f"output.dir={tmp_path / 'avg'}", "algorithm.name=fedavg")
    got = train_ok(small_config, f"output.dir={tmp_path / 'm'}", f"algorithm.name={method}", off)
    on = train_ok(small_config, f"output.dir={tmp_path / 'on'}", f"algorithm.name={method}")
    assert got["model_sha256"] == avg["model_sha256"] != on["model_sha256"]
    assert [r["train_loss"] for r in metrics(tmp_path / "m")] == [r["train_loss"] for r in metrics(tmp_path / "avg")]


@pytest.mark.parametrize("method", ["fedlc", "fedntd"])
def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config, method):
    one, two, resumed = one_two_resumed(small_config, tmp_path, f"algorithm.name={method}")
    assert one["algorithm"] == method


# ---- FedNTD ----------------------------------------------------------------------------------------

def _ntd64(logits, global_logits, y, tau):
    """KL(q~_g || q~_l) over the not-true classes, float64, written with explicit loops."""
    f, g, y = logits.detach().double().numpy(), global_logits.double().numpy(), y.numpy()
    total = 0.0
    for i in range(len(y)):
        keep = [c for c in range(f.shape[1]) if c != y[i]]
        lf, lg = f[i, keep] / tau, g[i, keep] / tau
        pl = np.exp(lf - lf.max()) / np.exp(lf - lf.max()).sum()
        pg = np.exp(lg - lg.max()) / np.exp(lg - lg.max()).sum()
        total += float((pg * (np.log(pg) - np.log(pl))).sum())
    return total / len(y)


def test_fedntd_local_loss_is_ce_plus_beta_not_true_kl(tmp_path):
    """From a global model w^t and a local model that has moved away from it: the loss is the
    cross-entropy plus beta times the not-true KL, recomputed; the true class's logit does not enter
    the KL (changing it leaves the term as it is)."""
    import torch.nn.functional as F

    from distfl.algorithms.fedntd import ntd_loss
    from distfl.federation.local import ClientRun

    beta, tau = 0.7, 2.0
    trainer = _trainer(tmp_path, "ntd", "algorithm.name=fedntd", f"algorithm.options.beta={beta}",
                       f"algorithm.options.tau={tau}")
    trainer.run_round(1)  # w^t != w^0
    client = 0
    run = ClientRun(client_id=client, round_idx=2, num_samples=1, weight=1.0, steps=1,
                    global_params=trainer.global_params)
    worker, alg = trainer.worker, trainer.algorithm
    worker.load(trainer.global_params, trainer.global_buffers)
    alg.begin_client(run, worker)
    w0 = _initial_model(trainer)
    _load_flat(w0, worker.params + 0.05 * torch.randn(worker.num_params, generator=torch.Generator().manual_seed(0)))
    x, y = _batch(trainer, client)
    with torch.no_grad():
        global_logits = _initial_model(trainer)
        _load_flat(global_logits, trainer.global_params)
        g = global_logits(x)
    got = float(alg.local_loss(w0, x, y, run).detach())
    f = w0(x)
    expected = float(F.cross_entropy(f, y).double()) + beta * _ntd64(f, g, y, tau)
    assert got == pytest.approx(expected, rel=1e-6)
    assert _ntd64(f, g, y, tau) > 1e-4  # the term is not trivially zero here
    moved = f.detach().clone()
    moved[torch.arange(len(y)), y] += 5.0
    assert float(ntd_loss(moved, g, y, tau)) == pytest.approx(float(ntd_loss(f.detach(), g, y, tau)), rel=1e-6)


@pytest.mark.parametrize("overrides, says", [
    (["algorithm.name=fedlc", "algorithm.options.tau=-1"], "algorithm.options.tau"),
    (["algorithm.name=fedntd", "algorithm.options.tau=0"], "algorithm.options.tau"),
    (["algorithm.name=fedlc", "model.head=sphere"], "model.head=linear"),
    (["algorithm.name=fedntd", "model.head=sphere"], "model.head=linear"),
    (["algorithm.name=fedntd", "runtime.pack_size=2"], "local_loss"),
])
def test_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", overrides, says)


@pytest.mark.parametrize("method", ["fedlc", "fedntd"])
def test_private_release_runs_under_dp_and_local_only_is_refused(tmp_path, small_config, method):
    """Both release only their model update: accepted under privacy.mechanism=gaussian and trained; a
    method that keeps whole models per client releases nothing to protect and is not declared so."""
    dp = ["privacy.mechanism=gaussian", "privacy.delta=1e-3", "algorithm.weighting=uniform",
          "privacy.noise_multiplier=0.5", "train.rounds=2"]
    s = train_ok(small_config, f"output.dir={tmp_path / 'dp'}", f"algorithm.name={method}", *dp)
    assert s["status"] == "completed" and s["privacy"]["mechanism"] == "gaussian"
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'local'}", "algorithm.name=local", *dp])
    assert proc.returncode == 2 and "private_release" in proc.stderr

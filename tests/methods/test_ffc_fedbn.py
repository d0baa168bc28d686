"""FFC and CCVR under FedBN: each client's features come from its own model, the global one with its own BatchNorm
(the global BatchNorm for a client never sampled), as in per-client evaluation (docs/algorithms/fedbn.md)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import Started, run_cli, summary, train_ok, write_config
from distfl.algorithms.ffc import STATS_FILE
from distfl.checkpoint import complete_checkpoints, load, load_tensors
from distfl.data.client_test import client_test_sets
from distfl.data.datasets import find_fmnist
from distfl.federation.local import FlatModel
from distfl.models import build_model


def _fmnist_available() -> bool:
    try:
        find_fmnist("./data", download=False)
        return True
    except Exception:
        return False


pytestmark = pytest.mark.skipif(not _fmnist_available(), reason="needs the real Fashion-MNIST")

RIDGE = 0.01


def _config(tmp_path: Path) -> Path:
    """ResNet-20 (BatchNorm) on 600 training and 200 test images of Fashion-MNIST, 6 clients, 3 a round,
    2 rounds: after them some clients have their own BatchNorm and some were never sampled."""
    from distfl.data.datasets import load_dataset
    from distfl.config.schema import DataConfig

    data = load_dataset(DataConfig(dataset="fmnist", download=False), seed=0)
    path = tmp_path / "fmnist_subset.npz"
    np.savez(path, x_train=data.train_x[:600].numpy(), y_train=data.train_y[:600].numpy(),
             x_test=data.test_x[:200].numpy(), y_test=data.test_y[:200].numpy())
    return write_config(tmp_path / "ffc_bn.yaml", seed=0, data={"dataset": "files", "path": str(path)},
                        model={"name": "resnet20"},
                        partition={"scheme": "dirichlet", "num_clients": 6, "alpha": 0.5},
                        train={"rounds": 2, "clients_per_round": 3, "lr": 0.05, "batch_size": 32},
                        eval={"every": 1, "clients": True}, checkpoint={"every": 0, "keep": 3},
                        aggregation={"fedbn": True}, calibration={"method": "ffc", "ridge": RIDGE})


def _own_models(run_dir: Path):
    """From the last training round's checkpoint: the trainer's config and data, a model, and for every
    client the (params, buffers) it uses: the global ones with its own BatchNorm from its checkpointed
    state, or the global ones if it has no state. The BatchNorm coordinates are found here by name."""
    from distfl.config import load_config
    from distfl.data.datasets import load_dataset
    from distfl.data.partition import partition

    cfg = load_config(str(run_dir / "config.yaml"))
    data = load_dataset(cfg.data, cfg.seed)
    parts = partition(data.train_y.numpy(), cfg.partition, data.num_classes, cfg.seed)
    trained = [p for p in complete_checkpoints(run_dir) if p.name.startswith("round_")][-1]
    state = load(trained, "cpu")
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    flat = FlatModel(model)
    bn_params = torch.zeros(flat.num_params, dtype=torch.bool)
    bn_buffers = torch.zeros(flat.buffers.numel(), dtype=torch.bool)
    for name, module in model.named_modules():
        if isinstance(module, nn.BatchNorm2d):
            for key in ("weight", "bias"):
                bn_params[flat.param_slices[f"{name}.{key}"]] = True
            for key in ("running_mean", "running_var"):
                bn_buffers[flat.buffer_slices[f"{name}.{key}"]] = True
    own = []
    for k in range(len(parts)):
        params, buffers = state["params"].clone(), state["buffers"].clone()
        client_file = trained / "clients" / f"{k}.pt"
        if client_file.exists():
            client = load_tensors(client_file, "cpu")
            params[bn_params], buffers[bn_buffers] = client["bn_params"], client["bn_buffers"]
        own.append((params, buffers, client_file.exists()))
    return cfg, data, parts, model, flat, state, own


def _features(model, flat, params, buffers, x) -> torch.Tensor:
    flat.load(params, buffers)
    model.eval()
    with torch.no_grad():
        return F.normalize(model.features(x).double(), dim=1)


@pytest.fixture(scope="module")
def ffc_one_rank(tmp_path_factory):
    """(config, run directory, summary): the config's run on one rank, which both FFC tests check."""
    tmp = tmp_path_factory.mktemp("ffc_fedbn")
    config = _config(tmp)
    return config, tmp / "one", train_ok(config, f"output.dir={tmp / 'one'}")


def test_ffc_under_fedbn_uses_each_clients_own_batchnorm(ffc_one_rank):
    _, run, out = ffc_one_rank
    cfg, data, parts, model, flat, state, own = _own_models(run)
    sampled = [k for k, (_, _, has) in enumerate(own) if has]
    assert 0 < len(sampled) < len(parts)  # both kinds of client occur

    # (sum_k Z_k^T Z_k + ridge I)^-1 sum_k Z_k^T Y_k in float64, Z_k from client k's own model.
    d, c = model.feature_dim, data.num_classes
    a = torch.zeros(d, d, dtype=torch.float64)
    b = torch.zeros(d, c, dtype=torch.float64)
    a_global = torch.zeros_like(a)
    for k, idx in enumerate(parts):
        idx = torch.from_numpy(idx)
        y = F.one_hot(data.train_y[idx], c).double()
        z = _features(model, flat, own[k][0], own[k][1], data.train_x[idx])
        a += z.t() @ z
        b += z.t() @ y
        z_global = _features(model, flat, state["params"], state["buffers"], data.train_x[idx])
        a_global += z_global.t() @ z_global
    expected = torch.linalg.solve(a + RIDGE * torch.eye(d, dtype=torch.float64), b)

    saved = torch.load(run / STATS_FILE)
    assert out["phases"]["ffc"]["samples"] == sum(len(p) for p in parts) == 600
    # Only the 2^-f fixed-point rounding of the sums separates the run from the float64 recomputation.
    assert float((saved["ztz"] - a).abs().max()) < 1e-9
    assert float((saved["weight_t"] - expected).norm() / expected.norm()) < 1e-8
    # The global BatchNorm's features are another matrix: the check above can tell them apart.
    assert float((a_global - a).abs().max()) > 1e-2
    final = load(complete_checkpoints(run)[-1], "cpu")
    head = final["params"][flat.param_slices["head.weight"]].view(c, d)
    assert torch.equal(head, saved["weight_t"].t().to(torch.float32))

    # The evaluation after FFC follows the same rule: each client's own model (own BatchNorm, or the
    # global one if never sampled) with the calibrated head on its local test set.
    sets = client_test_sets(np.stack([np.bincount(data.train_y[torch.from_numpy(p)].numpy(), minlength=c)
                                      for p in parts]), data.test_y.numpy(), 0, cfg.seed)
    model.feature_norm = True  # the calibrated model: W* z on normalised features
    accuracies = []
    for k, idx in enumerate(sets):
        idx = torch.from_numpy(idx)
        params = own[k][0].clone()
        params[flat.param_slices["head.weight"]] = head.reshape(-1)
        params[flat.param_slices["head.bias"]] = 0.0
        flat.load(params, own[k][1])
        model.eval()
        with torch.no_grad():
            predicted = model(data.test_x[idx]).argmax(1)
        accuracies.append(float((predicted == data.test_y[idx]).double().mean()))
    assert out["final_client_acc"]["mean"] == pytest.approx(float(np.mean(accuracies)), abs=1e-12)
    assert out["phases"]["ffc"]["client_acc_mean"] == out["final_client_acc"]["mean"]


def test_ffc_under_fedbn_one_rank_equals_two_and_calibrating_later(tmp_path, ffc_one_rank):
    """Clients' BatchNorm lives on the rank that hosts them (memory store), or on disk for any rank;
    the sums are exact, so 1 rank, 2 ranks, and calibrating the finished run later (client states
    restored from its checkpoint, on another number of ranks) give the same bits."""
    config, one_dir, one = ffc_one_rank
    # The 2-rank runs train beside the 1-rank run in this process.
    runs = {"two": (f"output.dir={tmp_path / 'two'}",),
            "disk": (f"output.dir={tmp_path / 'disk'}", "runtime.client_state=disk", "runtime.placement=balanced")}
    started = {name: Started(["train", config, *overrides], nproc=2) for name, overrides in runs.items()}
    try:
        train_ok(config, f"output.dir={tmp_path / 'later'}", "calibration.method=none", "calibration.ridge=0")
        two, disk = (train_ok(config, *runs[name], started=started[name]) for name in ("two", "disk"))
    finally:
        for run in started.values():
            run.stop()
    proc = run_cli(["calibrate", tmp_path / "later", f"calibration.ridge={RIDGE}"], nproc=2)
    assert proc.returncode == 0, proc.stderr
    later = summary(tmp_path / "later")
    assert one["model_sha256"] == two["model_sha256"] == disk["model_sha256"] == later["model_sha256"]
    weights = [torch.load(folder / STATS_FILE)["weight_t"]
               for folder in (one_dir, tmp_path / "two", tmp_path / "disk", tmp_path / "later")]
    assert all(torch.equal(w, weights[0]) for w in weights)
    assert one["final_client_acc"] == two["final_client_acc"] == disk["final_client_acc"] == later["final_client_acc"]
    assert two["collectives"]["calls"]["ffc"] == 1


def test_ccvr_under_fedbn_uses_each_clients_own_batchnorm(tmp_path):
    """CCVR's Gaussians under FedBN are the pooled per-class mean and covariance of each client's features
    from its own model (own BatchNorm; the global one for a client never sampled), not the global model's."""
    from distfl.algorithms.ccvr import STATS_FILE as CCVR_STATS

    config = _config(tmp_path)
    train_ok(config, f"output.dir={tmp_path / 'r'}", "calibration.method=ccvr", "calibration.virtual_samples=20",
             "calibration.retrain_epochs=1")
    cfg, data, parts, model, flat, state, own = _own_models(tmp_path / "r")
    assert 0 < sum(has for _, _, has in own) < len(parts)
    z, z_global, y = [], [], []
    for k, idx in enumerate(parts):
        idx = torch.from_numpy(idx)
        for out, (params, buffers) in ((z, own[k][:2]), (z_global, (state["params"], state["buffers"]))):
            flat.load(params, buffers)
            model.eval()
            with torch.no_grad():
                out.append(model.represent(data.train_x[idx]).double())
        y.append(data.train_y[idx])
    z, z_global, y = torch.cat(z), torch.cat(z_global), torch.cat(y)
    saved = torch.load(tmp_path / "r" / CCVR_STATS)
    for c in range(data.num_classes):
        if int((y == c).sum()) < 2:
            continue
        torch.testing.assert_close(saved["means"][c], z[y == c].mean(0), rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(saved["covs"][c], torch.cov(z[y == c].t()), rtol=1e-9, atol=1e-10)
    # The global BatchNorm's features give other statistics: the check above can tell them apart.
    assert float((torch.cov(z_global[y == 0].t()) - saved["covs"][0]).abs().max()) > 1e-3

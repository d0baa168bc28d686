"""FedPAC: the simplex quadratic program against brute force; two rounds recomputed with a plain nn.Module and
numpy (statistics V_i and h_i, head pass, body pass with the feature alignment to the global centroids,
the server's FedAvg body, centroids and combined heads by the paper's program solved by enumeration);
lam = 0 without collaboration == FedRep (1 head epoch, 1 body epoch) bit for bit; 1 rank == 2 ranks ==
stopped-and-resumed (the heads are server state); refusals. docs/algorithms/fedpac.md."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import assert_refused, metrics, one_and_two, train_ok
from test_personalised import assert_clients_scored_with, _head_mask, _initial_model, _load_flat, _flat, _trainer


def _brute_force(P: np.ndarray) -> np.ndarray:
    """argmin a^T P a over the simplex by enumeration: on every support S, the minimum over the affine hull
    (the KKT system, numpy), kept if it is nonnegative; the best of those."""
    m, best, arg = len(P), np.inf, None
    for r in range(1, m + 1):
        for S in itertools.combinations(range(m), r):
            S = list(S)
            kkt = np.zeros((r + 1, r + 1))
            kkt[:r, :r], kkt[:r, r], kkt[r, :r] = 2 * P[np.ix_(S, S)], 1.0, 1.0
            x = np.linalg.lstsq(kkt, np.r_[np.zeros(r), 1.0], rcond=None)[0][:r]
            if (x < -1e-12).any():
                continue
            a = np.zeros(m)
            a[S] = x
            if a @ P @ a < best - 1e-15:
                best, arg = a @ P @ a, a
    return arg


@pytest.mark.parametrize("seed", range(40))
def test_simplex_qp_equals_brute_force(seed):
    from distfl.algorithms.fedpac import simplex_qp

    rng = np.random.default_rng(seed)
    m = int(rng.integers(1, 9))
    A = rng.normal(size=(m, int(rng.integers(1, 6))))  # often rank-deficient: the diagonal makes it definite
    P = np.diag(rng.uniform(0, 1, m) * rng.uniform(0.01, 2)) + A @ A.T
    got = simplex_qp(torch.tensor(P)).numpy()
    want = _brute_force(P)
    assert abs(got.sum() - 1) < 1e-12 and (got >= 0).all()
    np.testing.assert_allclose(got, want, atol=1e-10)
    assert got @ P @ got <= want @ P @ want * (1 + 1e-12)


def test_min_weight_drops_small_weights_and_rescales():
    from distfl.algorithms.fedpac import combination_weights

    var = torch.tensor([1.0, 1.0, 30.0], dtype=torch.float64)
    h = torch.zeros(3, 2, dtype=torch.float64)  # no bias term: weights 1/V normalised = [30, 30, 1] / 61
    np.testing.assert_allclose(combination_weights(var, h, 0).numpy(), np.array([30, 30, 1]) / 61, rtol=1e-12)
    np.testing.assert_allclose(combination_weights(var, h, 0, min_weight=0.1).numpy(), [0.5, 0.5, 0.0], rtol=1e-12)


def _class_stats(module, x, y, num_classes):
    """n_k, sum z, sum ||z||^2 of the features in eval mode, float64."""
    with torch.no_grad():
        z = module.features(x).double()
    counts = np.array([(y == k).sum().item() for k in range(num_classes)], dtype=np.float64)
    sums = np.stack([z[y == k].sum(0).numpy() for k in range(num_classes)])
    squares = np.array([(z[y == k] ** 2).sum().item() for k in range(num_classes)])
    return counts, sums, squares


def _sgd(module, batches, lr, params, loss_of):
    for x, y in batches:
        module.zero_grad(set_to_none=True)
        loss_of(x, y).backward()
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-lr)


@pytest.mark.parametrize("lam, reduction, scale", [(0.5, "mean", 1.0), (0.05, "sum", 3.0)])
def test_two_rounds_recomputed(tmp_path, lam, reduction, scale):
    from distfl.federation.local import local_batches
    from distfl.federation.population import client_seed

    trainer = _trainer(tmp_path, "pac", "algorithm.name=fedpac", f"algorithm.options.lam={lam}", "eval.clients=true",
                       f"algorithm.options.align_reduction={reduction}", f"algorithm.options.head_lr_scale={scale}")
    cfg, K = trainer.cfg, trainer.data.num_classes
    head_mask = _head_mask(trainer)
    global_flat, heads = trainer.global_params.clone(), {}
    centroids, present = None, None
    for t in (1, 2):
        trainer.run_round(t)
        cohort = trainer.population.cohort(cfg.seed, t, cfg.train.clients_per_round)
        sizes = np.array([int(trainer.population.sizes[c]) for c in cohort], dtype=np.float64)
        delta, trained_heads, V, H = torch.zeros_like(global_flat), [], [], []
        class_n, class_sum = np.zeros(K), np.zeros((K, trainer.worker.module.feature_dim))
        for client, size in zip(cohort, sizes):
            module = _initial_model(trainer)
            start = global_flat.clone()
            if client in heads:
                start[head_mask] = heads[client].float()
            _load_flat(module, start)
            idx = trainer.client_indices[client]
            x_all, y_all = trainer.data.train_x[idx], trainer.data.train_y[idx]
            n_k, s1, s2 = _class_stats(module, x_all, y_all, K)
            n = n_k.sum()
            V.append((s2.sum() / n - (s1 ** 2).sum() / n ** 2) / n)  # (sum_k p_k E||z||^2 - sum_k ||p_k mu_k||^2) / n
            H.append((s1 / n).reshape(-1))  # p_k mu_k
            torch.manual_seed(client_seed(cfg.seed, t, client))
            ce = lambda x, y: F.cross_entropy(module(x), y)  # noqa: E731
            _sgd(module, local_batches(trainer.data, idx, cfg.train, epochs=1), cfg.train.lr * scale,
                 list(module.head.parameters()), ce)
            trained_heads.append(torch.cat([p.detach().reshape(-1) for p in module.head.parameters()]).double())
            if centroids is None:
                body_loss = ce
            else:
                own = s1 / np.maximum(n_k, 1)[:, None]
                target = torch.tensor(np.where(present[:, None], centroids, own), dtype=torch.float32)

                def body_loss(x, y, target=target):
                    z = module.features(x)
                    gap = (z - target[y]) ** 2  # mean: over the batch and the d features; sum: over the batch only
                    return F.cross_entropy(module.head(z), y) + lam * (gap.mean() if reduction == "mean" else gap.sum(1).mean())
            _sgd(module, local_batches(trainer.data, idx, cfg.train), cfg.train.lr,
                 list(module.features.parameters()), body_loss)
            delta += (_flat(module) - global_flat).masked_fill(head_mask, 0.0) * float(size / sizes.sum())
            post_n, post_sum, _ = _class_stats(module, x_all, y_all, K)
            class_n += post_n
            class_sum += post_sum
        global_flat = global_flat + delta
        assert torch.allclose(trainer.global_params, global_flat, rtol=1e-4, atol=1e-6), t
        present = class_n > 0
        centroids = np.where(present[:, None], class_sum / np.maximum(class_n, 1)[:, None], 0.0)
        np.testing.assert_allclose(trainer.algorithm.centroids.numpy(), centroids, rtol=1e-4, atol=1e-5)
        V, H, phis = np.array(V), np.stack(H), torch.stack(trained_heads).numpy()
        for i, client in enumerate(cohort):
            # the paper's program: min_a sum_j a_j^2 V_j + sum_k ||sum_j a_j (h_i[k] - h_j[k])||^2 over the simplex
            D = np.array([[np.dot(H[i] - H[j1], H[i] - H[j2]) for j2 in range(len(cohort))]
                          for j1 in range(len(cohort))])
            alpha = _brute_force(np.diag(V) + D)
            heads[client] = torch.tensor(alpha @ phis)
            np.testing.assert_allclose(trainer.algorithm.heads[client].numpy(), heads[client].numpy(),
                                       rtol=1e-4, atol=1e-5)

    def load(client, worker):
        if client in heads:
            worker.params[head_mask] = trainer.algorithm.heads[client]

    assert_clients_scored_with(trainer, load)


def test_without_alignment_and_collaboration_is_fedrep_bit_for_bit(tmp_path, small_config):
    rep = train_ok(small_config, f"output.dir={tmp_path / 'rep'}", "algorithm.name=fedrep", "eval.clients=true",
                   "algorithm.options.head_epochs=1", "algorithm.options.body_epochs=1")
    pac = train_ok(small_config, f"output.dir={tmp_path / 'pac'}", "algorithm.name=fedpac", "eval.clients=true",
                   "algorithm.options.lam=0", "algorithm.options.combine=false")
    full = train_ok(small_config, f"output.dir={tmp_path / 'full'}", "algorithm.name=fedpac", "eval.clients=true",
                    "algorithm.options.lam=0")
    assert rep["model_sha256"] == pac["model_sha256"] and rep["final_client_acc"] == pac["final_client_acc"]
    assert [r["train_loss"] for r in metrics(tmp_path / "rep")] == [r["train_loss"] for r in metrics(tmp_path / "pac")]
    assert full["final_client_acc"] != pac["final_client_acc"]  # the combined heads score otherwise
    assert full["model_sha256"] != pac["model_sha256"]  # ... and the bodies train on them


def _server_heads(run_dir):
    from distfl import checkpoint

    folder = checkpoint.checkpoints_dir(run_dir)
    state = torch.load(folder / (folder / "latest").read_text().strip() / "state.pt", weights_only=True)
    return state["server"]


def test_one_rank_equals_two_ranks_equals_resumed(tmp_path, small_config):
    args = ["algorithm.name=fedpac", "eval.clients=true"]
    one, two = one_and_two(small_config, tmp_path, *args)
    train_ok(small_config, f"output.dir={tmp_path / 'res'}", *args, "train.rounds=4")
    res = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "res"))
    assert two["world_size"] == 2
    assert one["model_sha256"] == two["model_sha256"] == res["model_sha256"]
    assert one["final_client_acc"] == two["final_client_acc"] == res["final_client_acc"]
    keys = ("test_acc", "train_loss", "client_acc_mean", "fedpac_own_weight", "fedpac_heads_combined")
    rows = {k: [{key: r.get(key) for key in keys} for r in metrics(tmp_path / k)] for k in ("one", "two", "res")}
    assert rows["one"] == rows["two"] and rows["one"][0]["fedpac_own_weight"] is not None
    # the stopped run also evaluated at its last round (4): its training rows are the same
    assert [{k: r[k] for k in keys[1:] if k != "client_acc_mean"} for r in rows["one"]] == \
        [{k: r[k] for k in keys[1:] if k != "client_acc_mean"} for r in rows["res"]]
    states = {k: _server_heads(tmp_path / k) for k in ("one", "two", "res")}
    for k in ("two", "res"):
        for key in ("head_clients", "heads", "centroids", "present"):
            assert torch.equal(states["one"][key], states[k][key]), (k, key)
    assert len(states["one"]["head_clients"]) >= 6


@pytest.mark.parametrize("overrides, says", [
    (["train.cohort=poisson"], "train.cohort=poisson"),
    (["model.head=sphere"], "model.head=linear"),
    (["runtime.pack_size=2"], "cannot train clients in packs"),
    (["eval.clients=true", "eval.finetune_epochs=2"], "is personalised"),
    (["algorithm.options.head_epochs=0"], "head_epochs"),
    (["privacy.mechanism=gaussian", "privacy.noise_multiplier=1", "privacy.delta=0.01",
      "algorithm.weighting=uniform"], "classifier head, feature statistics"),
])
def test_refused_before_any_work(tmp_path, small_config, overrides, says):
    assert_refused(small_config, tmp_path / "r", ["algorithm.name=fedpac", *overrides], says)

"""GMA (aggregation.mask=gma) and FedBN (aggregation.fedbn): identities from the papers, exact tests."""
import pytest
import torch

from conftest import build_trainer, metrics, one_and_two, record_client_models, run_cli, train_ok, write_config
from distfl.algorithms.gma import agreement_mask


def _split(pos: int, neg: int, zero: int = 0) -> torch.Tensor:
    return torch.tensor([pos - neg])  # the summed signs of one coordinate


@pytest.mark.parametrize("pos,neg,expected", [(10, 0, 1.0), (7, 3, 1.0), (3, 7, 1.0), (6, 4, 0.2), (5, 5, 0.0)])
def test_mask_values_for_sign_splits_of_ten_clients(pos, neg, expected):
    mask, _ = agreement_mask(_split(pos, neg), num_clients=10, tau=0.4)
    assert mask.item() == pytest.approx(expected, abs=1e-7)


def test_zero_signs_count_for_neither_side_but_in_the_cohort():
    # 6 positive, 2 negative, 2 did not move: A = |6 - 2| / 10 = 0.4 >= tau -> 1; at tau 0.5 -> 0.4.
    assert agreement_mask(torch.tensor([4]), 10, 0.4)[0].item() == 1.0
    assert agreement_mask(torch.tensor([4]), 10, 0.5)[0].item() == pytest.approx(0.4)


def test_identical_updates_give_mask_one_and_stats():
    signs = torch.sign(torch.randn(1000))
    signs[signs == 0] = 1
    mask, stats = agreement_mask(8 * signs.long(), num_clients=8, tau=0.9)
    assert torch.equal(mask, torch.ones(1000))
    assert stats == {"gma/frac_below_tau": 0.0, "gma/mean_mask": 1.0, "gma/frac_zero_agreement": 0.0}


def gma_server_step(theta, clients, tau, server, moments):
    """Algorithm 1 of the GMA paper (Algorithm 2 for FedAdam, mask on the final adaptive step), float64:
    A = |sum_n sign(w_n - theta)| / |C|, mask = 1 where A >= tau else A, Delta = sum_n p_n (w_n - theta)."""
    deltas = [(w - theta).double() for w, _ in clients]  # the model delta, as a client sends it
    agreement = torch.stack([d.sign() for d in deltas]).sum(0).abs() / len(deltas)
    mask = torch.where(agreement >= tau, torch.ones_like(agreement), agreement)
    update = sum(weight * d for d, (_, weight) in zip(deltas, clients))
    if server["optimizer"] == "sgd":
        step = server["lr"] * update
    else:  # FedAdam (Reddi et al.): no bias correction, v from eps^2
        moments["z"] = server["beta1"] * moments["z"] + (1 - server["beta1"]) * update
        moments["v"] = server["beta2"] * moments["v"] + (1 - server["beta2"]) * update**2
        step = server["lr"] * moments["z"] / (moments["v"].sqrt() + server["eps"])
    return theta.double() + mask * step, theta.double() + step, mask


@pytest.mark.parametrize("server", [{"optimizer": "sgd", "lr": 1.0},
                                    {"optimizer": "adam", "lr": 0.01, "beta1": 0.9, "beta2": 0.99, "eps": 1e-3}],
                         ids=["fedavg", "fedadam"])
def test_round_equals_algorithm_1_recomputed_from_the_client_models(tmp_path, small_config, server):
    tau = 0.4
    trainer = build_trainer(small_config, tmp_path / "r", "aggregation.mask=gma", f"aggregation.tau={tau}",
                            *(f"server.{k}={v}" for k, v in server.items()))
    clients = record_client_models(trainer)
    numel = trainer.global_params.numel()
    moments = {"z": torch.zeros(numel, dtype=torch.float64), "v": torch.full((numel,), 1e-6, dtype=torch.float64)}
    for t in (1, 2, 3):
        theta = trainer.global_params.clone()
        clients.clear()
        trainer.run_round(t)
        assert len(clients) == 5
        expected, unmasked, mask = gma_server_step(theta, clients, tau, server, moments)
        # Masks strictly between 0 and 1 (A = 1/5 -> 0.2) and ones (A >= 0.4) on many coordinates.
        assert 0.05 < float((mask < 1).double().mean()) < 0.95 and bool(((mask > 0) & (mask < 1)).any())
        # The model is float32: the run's result is the recomputation rounded, up to a few float32 ulps.
        tolerance = 8 * torch.finfo(torch.float32).eps * (theta.double().abs() + (unmasked - theta.double()).abs())
        assert ((trainer.global_params.double() - expected).abs() <= tolerance).all(), t
        assert ((trainer.global_params.double() - unmasked).abs() > 100 * tolerance).any()


def test_gma_changes_the_model_and_logs_its_statistics(tmp_path, small_config):
    plain = train_ok(small_config, f"output.dir={tmp_path / 'plain'}")
    gma = train_ok(small_config, f"output.dir={tmp_path / 'gma'}", "aggregation.mask=gma")
    assert gma["model_sha256"] != plain["model_sha256"]
    row = metrics(tmp_path / "gma")[0]
    assert 0 < row["gma/frac_below_tau"] < 1
    assert 0 < row["gma/mean_mask"] < 1
    assert 0 <= row["gma/frac_zero_agreement"] <= row["gma/frac_below_tau"]


def test_gma_with_one_client_per_round_is_fedavg(tmp_path, small_config):
    """A single client always agrees with itself: mask 1 wherever its update is non-zero."""
    one = ["train.clients_per_round=1"]
    plain = train_ok(small_config, f"output.dir={tmp_path / 'plain'}", *one)
    gma = train_ok(small_config, f"output.dir={tmp_path / 'gma'}", *one, "aggregation.mask=gma", "aggregation.tau=1")
    assert gma["model_sha256"] == plain["model_sha256"]


def test_mask_placement_matters_only_for_stateful_server_optimizers(tmp_path, small_config):
    runs = {}
    for opt in ("sgd", "adam"):
        for where in ("step", "update"):
            runs[opt, where] = train_ok(small_config, f"output.dir={tmp_path / (opt + where)}",
                                        f"server.optimizer={opt}", "server.lr=0.5" if opt == "sgd" else "server.lr=0.01",
                                        "aggregation.mask=gma", f"aggregation.mask_applies_to={where}")["model_sha256"]
    assert runs["sgd", "step"] == runs["sgd", "update"]
    assert runs["adam", "step"] != runs["adam", "update"]


@pytest.mark.parametrize("extra", [["aggregation.mask=gma"], ["aggregation.mask=gma", "server.optimizer=adam",
                                                              "server.lr=0.01", "algorithm.name=scaffold"]])
def test_gma_one_rank_equals_two_ranks_with_one_collective(tmp_path, small_config, extra):
    one, two = one_and_two(small_config, tmp_path, *extra)
    assert one["model_sha256"] == two["model_sha256"]
    assert two["collectives"]["calls"]["round_stats"] == 6


@pytest.mark.parametrize("tau", ["-0.1", "1.5"])
def test_tau_outside_unit_interval_is_refused(tmp_path, small_config, tau):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'r'}", "aggregation.mask=gma",
                    f"aggregation.tau={tau}"])
    assert proc.returncode == 2 and "aggregation.tau" in proc.stderr


# ---- FedBN -----------------------------------------------------------------------------------------

def _bn_config(tmp_path):
    return write_config(tmp_path / "bn.yaml", model={"name": "resnet20"}, data={"synthetic_channels": 3},
                        train={"rounds": 3, "clients_per_round": 4}, aggregation={"fedbn": True})


def test_fedbn_needs_batchnorm(tmp_path, small_config):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'r'}", "aggregation.fedbn=true"])
    assert proc.returncode == 2 and "aggregation.fedbn" in proc.stderr and "mlp" in proc.stderr
    assert not (tmp_path / "r").exists()


def test_fedbn_clients_keep_their_own_batchnorm(tmp_path):
    trainer = build_trainer(_bn_config(tmp_path), tmp_path / "r", "train.clients_per_round=12")
    alg = trainer.algorithm
    trainer.run_round(1)
    kept = {c: trainer.store.get(c, dict) for c in range(12)}
    assert all("bn_params" in s for s in kept.values())
    # Clients trained on different data end with different BatchNorm.
    assert not torch.equal(kept[0]["bn_buffers"], kept[1]["bn_buffers"])
    # In round 2 client 0 starts from its own BatchNorm, not the averaged one.
    from distfl.federation.local import ClientRun

    run = ClientRun(0, 2, 1, 1.0, 1, trainer.global_params, state=trainer.store.get(0, dict))
    trainer.worker.load(trainer.global_params, trainer.global_buffers)
    alg.begin_client(run, trainer.worker)
    assert torch.equal(trainer.worker.buffers[alg.bn_buffers], kept[0]["bn_buffers"])
    assert torch.equal(trainer.worker.params[alg.bn_params], kept[0]["bn_params"])
    assert not torch.equal(trainer.worker.buffers[alg.bn_buffers], trainer.global_buffers[alg.bn_buffers])
    # Everything that is not BatchNorm starts from the global model.
    assert torch.equal(trainer.worker.params[~alg.bn_params], trainer.global_params[~alg.bn_params])


def test_fedbn_one_rank_equals_two_ranks_and_resumes(tmp_path):
    cfg = _bn_config(tmp_path)
    one, two = one_and_two(cfg, tmp_path)
    assert one["model_sha256"] == two["model_sha256"]
    train_ok(cfg, f"output.dir={tmp_path / 'stopped'}", "train.rounds=2")
    resumed = train_ok(None, "train.rounds=3", resume=str(tmp_path / "stopped"))
    assert resumed["model_sha256"] == one["model_sha256"]


class _Recorded:
    """Stands in for the round's statistics: what a client adds, by segment name."""

    def __init__(self):
        self.added = {}

    def add(self, name, value, weight=1.0):
        self.added[name] = (torch.as_tensor(value).clone(), weight)


@pytest.mark.parametrize("name", ["fednova", "fedper"])
def test_gma_counts_the_signs_of_the_update_the_method_releases(method_fixture, name):
    """GMA wraps any method: the signs it adds (unweighted) are those of the delta the method adds, also
    where the method changes it (FedNova divides by its a_i; FedPer leaves the personal head at zero)."""
    f = method_fixture(f"algorithm.name={name}", "aggregation.mask=gma")
    n = f.worker.num_params
    f.worker.params.add_(torch.linspace(-1.0, 1.0, n) + 0.5 / n)  # a trained client: every coordinate moved
    stats = _Recorded()
    f.method.client_statistics(f.client_run(0), f.worker, stats)
    delta, _ = stats.added["delta"]
    signs, weight = stats.added["sign_sum"]
    assert torch.equal(signs, torch.sign(delta)) and weight == 1.0
    if name == "fedper":  # the head is the client's own: it moved, but counts for no sign
        head = f.method.head
        assert bool(head.any()) and not bool(signs[head].any()) and bool(signs[~head].all())


def test_gma_masks_the_server_step_of_the_wrapped_method(method_fixture):
    """The server step of a method under GMA is its own step times the agreement mask (Eq. 3): built
    without data from the reduced sums of three clients, one of them disagreeing on every coordinate."""
    f = method_fixture("aggregation.mask=gma", "aggregation.tau=1.0")
    n = f.worker.num_params
    delta = torch.linspace(-1.0, 1.0, n, dtype=torch.float64) + 0.5 / n
    reduced = {"delta": delta, "buffers": torch.zeros(f.worker.buffers.numel(), dtype=torch.float64),
               "sign_sum": torch.sign(delta).to(torch.int64), "clients": torch.tensor([3])}
    f.method.begin_round(1)
    params, buffers = f.global_params.clone(), f.worker.buffers.clone()
    f.method.server_update(params, buffers, reduced)
    # |sum of signs| / |C| = 1/3 < tau everywhere: the step is a third of the plain one.
    expected = f.global_params + (delta * (1.0 / 3.0)).to(torch.float32)
    torch.testing.assert_close(params, expected, rtol=1e-6, atol=1e-7)
    assert f.method.round_metrics["gma/frac_below_tau"] == 1.0

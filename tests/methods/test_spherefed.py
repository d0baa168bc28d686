"""SphereFed: the fixed orthonormal head, MSE on normalised features, and FFC calibration summed over ranks."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import build_trainer, metrics, one_and_two, run_cli, summary, train_ok, trained_model, write_config
from distfl.algorithms.ffc import STATS_FILE, fixed_point_bits, solve
from distfl.checkpoint import complete_checkpoints, load
from distfl.errors import ConfigError
from distfl.federation.local import FlatModel
from distfl.models import build_model
from distfl.models.heads import orthonormal_rows, orthonormality_error
from distfl.config.schema import ModelConfig

SPHERE = {"name": "mlp", "mlp_hidden": 32, "head": "sphere", "head_seed": 7}


def sphere_config(tmp_path: Path, **sections) -> Path:
    return write_config(tmp_path / "sphere.yaml", model=SPHERE, **sections)


@pytest.mark.parametrize("name,shape", [("mlp", (1, 8, 8)), ("simplecnn", (1, 28, 28)), ("resnet20", (3, 16, 16))])
def test_sphere_head_has_orthonormal_rows_from_its_seed_and_is_not_trained(name, shape):
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name, head="sphere", head_seed=3), shape, 10)
    w = model.head.weight
    assert w.shape == (10, model.feature_dim)
    assert orthonormality_error(w) < 1e-6
    again = build_model(ModelConfig(name=name, head="sphere", head_seed=3), shape, 10)
    assert torch.equal(again.head.weight, w)
    assert not torch.equal(build_model(ModelConfig(name=name, head="sphere", head_seed=4), shape, 10).head.weight, w)
    flat = FlatModel(model)
    assert "head.weight" not in flat.param_slices and "head.weight" not in flat.buffer_slices
    assert flat.frozen == [model.head.weight]
    # The extractor's initialisation does not depend on the head kind.
    torch.manual_seed(0)
    linear = build_model(ModelConfig(name=name), shape, 10)
    assert torch.equal(FlatModel(linear).params[: flat.num_params], flat.params)


def test_sphere_model_normalises_features_and_uses_mse():
    model = build_model(ModelConfig(name="mlp", head="sphere"), (1, 8, 8), 10)
    x, y = torch.randn(5, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4])
    z = model.represent(x)
    assert torch.allclose(z.norm(dim=1), torch.ones(5), atol=1e-6)
    logits = model(x)
    assert torch.allclose(logits, z @ model.head.weight.t())
    target = F.one_hot(y, 10).float()
    assert model.loss(logits, y).item() == pytest.approx(F.mse_loss(logits, target).item(), rel=1e-6)
    model.mse_reduction = "sum"
    assert model.loss(logits, y).item() == pytest.approx(10 * F.mse_loss(logits, target).item(), rel=1e-6)
    fixed = build_model(ModelConfig(name="mlp", head="fixed_random"), (1, 8, 8), 10)
    assert fixed.loss_kind == "ce" and not fixed.feature_norm and FlatModel(fixed).frozen


def test_sphere_head_needs_at_least_as_many_features_as_classes(tmp_path):
    with pytest.raises(ConfigError, match="d=4 < C=10"):
        build_model(ModelConfig(name="mlp", mlp_hidden=4, head="sphere"), (1, 8, 8), 10)
    proc = run_cli(["train", sphere_config(tmp_path), "model.mlp_hidden=4", f"output.dir={tmp_path / 'r'}"])
    assert proc.returncode == 2 and "d >= number of classes" in proc.stderr


def _frozen_head(run_dir: Path) -> torch.Tensor:
    return load(complete_checkpoints(run_dir)[-1], "cpu")["frozen"][0]


def test_head_bytes_unchanged_by_training_and_one_rank_equals_two(tmp_path):
    # FedProx + weight decay + momentum: every term that would move a trained parameter.
    config = sphere_config(tmp_path, algorithm={"name": "fedprox", "mu": 0.1},
                           train={"weight_decay": 0.01, "momentum": 0.9, "lr": 0.5})
    one, two = one_and_two(config, tmp_path)
    assert one["model_sha256"] == two["model_sha256"]
    built = orthonormal_rows(10, 32, seed=7).to(torch.float32)
    for run in ("one", "two"):
        assert torch.equal(_frozen_head(tmp_path / run), built)
    assert one["num_params"] == sum(p.numel() for p in build_model(ModelConfig(**SPHERE), (1, 8, 8), 10).features.parameters())
    first, last = metrics(tmp_path / "one")[0], metrics(tmp_path / "one")[-1]
    assert last["train_loss"] < first["train_loss"]  # the extractor does learn against the fixed head


def _pooled_reference(run_dir: Path, ridge: float) -> tuple[torch.Tensor, int]:
    """The single-process float64 solve on the pooled features of the checkpointed model before
    calibration: (Z^T Z + ridge I)^-1 Z^T Y, and at ridge 0 (the paper's lambda) the minimum-norm least
    squares solution pinv(Z) Y, which is the same when Z^T Z is invertible."""
    _, data, model, _ = trained_model(run_dir)
    model.eval()
    with torch.no_grad():
        z = F.normalize(model.features(data.train_x).double(), dim=1)
    y = F.one_hot(data.train_y, data.num_classes).double()
    if ridge == 0:
        return torch.linalg.pinv(z) @ y, len(y)
    a = z.t() @ z + ridge * torch.eye(z.shape[1], dtype=torch.float64)
    return torch.linalg.solve(a, z.t() @ y), len(y)


@pytest.mark.parametrize("model", [SPHERE, {"name": "mlp", "mlp_hidden": 32}], ids=["sphere", "cross-entropy"])
def test_ffc_over_ranks_equals_the_pooled_single_process_solve(tmp_path, model):
    """At the paper's lambda = 0: two ranks (gloo) sum the clients' Z^T Z and Z^T Y in one all_reduce
    and solve; the result is the pooled float64 least-squares solution, the same bits as one rank."""
    config = write_config(tmp_path / "c.yaml", model=model, calibration={"method": "ffc", "ridge": 0.0},
                          checkpoint={"every": 0, "keep": 3})
    two = train_ok(config, f"output.dir={tmp_path / 'two'}", nproc=2)
    one = train_ok(config, f"output.dir={tmp_path / 'one'}")
    assert one["model_sha256"] == two["model_sha256"]  # exact sums: same bits on 1 and 2 ranks
    ffc = two["phases"]["ffc"]
    assert two["world_size"] == 2 and two["collectives"]["calls"]["ffc"] == 1
    reference, n = _pooled_reference(tmp_path / "two", ridge=0.0)
    assert ffc["samples"] == n and ffc["trace"] == pytest.approx(n, rel=1e-12)
    solved = torch.load(tmp_path / "two" / STATS_FILE)["weight_t"]
    # Dead ReLU units make sum Z^T Z singular at lambda = 0 (rank 29 and 25 of 32 here): the minimum-norm
    # solution. Measured 1.7e-12 and 2.6e-10: the 2^-f rounding of the sums, times the conditioning.
    assert ffc["solver"] == "pseudo-inverse" and ffc["rank"] < 32
    assert float((solved - reference).norm() / reference.norm()) < 1e-8
    head = _final_head(tmp_path / "two", model)
    assert torch.equal(head, solved.t().to(torch.float32))
    assert two["final_test_acc"] == ffc["test_acc"]
    assert ffc["test_acc_before"] == metrics(tmp_path / "two")[-2]["test_acc"]  # the trained model, as evaluated


def _final_head(run_dir: Path, model: dict) -> torch.Tensor:
    state = load(complete_checkpoints(run_dir)[-1], "cpu")
    if model.get("head") == "sphere":
        return state["frozen"][0]
    flat = FlatModel(build_model(ModelConfig(**model), (1, 8, 8), 10))
    params = state["params"]
    assert torch.all(params[flat.param_slices["head.bias"]] == 0)
    return params[flat.param_slices["head.weight"]].view(10, -1)


def test_ffc_singular_system_falls_back_without_nan(tmp_path):
    # 8 hidden ReLU units feed 10 classes through a fixed random head: some units die, so with ridge 0
    # sum Z^T Z is singular.
    config = write_config(tmp_path / "c.yaml", model={"name": "mlp", "mlp_hidden": 8},
                          calibration={"method": "ffc"}, data={"synthetic_image_size": 3})
    proc = run_cli(["train", config, f"output.dir={tmp_path / 'r'}"])
    assert proc.returncode == 0, proc.stderr
    ffc = summary(tmp_path / "r")["phases"]["ffc"]
    state = load(complete_checkpoints(tmp_path / "r")[-1], "cpu")
    assert torch.isfinite(state["params"]).all()
    assert ffc["solver"] == "pseudo-inverse" and ffc["rank"] < 8 and ffc["condition_number"] is None
    assert "pseudo-inverse" in proc.stderr and "calibration.ridge" in proc.stderr


def test_solver_fallback_is_the_minimum_norm_least_squares_solution():
    gen = torch.Generator().manual_seed(0)
    z = F.normalize(torch.randn(30, 6, generator=gen, dtype=torch.float64), dim=1)
    z = torch.cat([z, z[:, :2]], dim=1)  # 8 features, rank 6: singular
    y = F.one_hot(torch.randint(0, 3, (30,), generator=gen), 3).double()
    wt, info = solve(z.t() @ z, z.t() @ y, ridge=0.0)
    assert info["solver"] == "pseudo-inverse" and info["rank"] == 6 and info["condition_number"] is None
    assert torch.allclose(wt, torch.linalg.pinv(z) @ y, atol=1e-10)
    wt, info = solve(z.t() @ z, z.t() @ y, ridge=0.5)
    assert info["solver"] == "cholesky" and math.isfinite(info["condition_number"])
    assert torch.allclose(wt, torch.linalg.solve(z.t() @ z + 0.5 * torch.eye(8, dtype=torch.float64), z.t() @ y))
    zero = torch.zeros(4, 4, dtype=torch.float64)
    wt, info = solve(zero, torch.zeros(4, 2, dtype=torch.float64), ridge=0.0)
    assert torch.equal(wt, torch.zeros(4, 2, dtype=torch.float64))


@pytest.mark.parametrize("n,clients", [(6000, 10), (10**6, 1000), (1, 1)])
def test_fixed_point_unit_sums_the_largest_entries_exactly(n, clients):
    """Every entry of A_k and B_k is at most n_k (products of unit-vector coordinates). At the unit FFC
    picks, `clients` such entries of either sign pass the int64 buffer's overflow guard and sum exactly,
    and one unit is kept."""
    from distfl import dist
    from distfl.federation.aggregate import Segment, StatBuffer

    bits = fixed_point_bits(n, clients)
    stats = StatBuffer([Segment("a", 3, frac_bits=bits, accumulate="int64")], torch.device("cpu"), clients)
    for _ in range(clients):
        stats.add("a", torch.tensor([float(n), -float(n), 2.0**-bits], dtype=torch.float64))
    assert not stats.reduce(dist.init("cpu", 1), name="test").problems()
    assert stats.view("a").tolist() == [clients * n * 2**bits, -clients * n * 2**bits, clients]


def test_crash_during_calibration_resumes_without_retraining(tmp_path, monkeypatch):
    config = sphere_config(tmp_path, calibration={"method": "ffc", "ridge": 0.01})
    through = train_ok(config, f"output.dir={tmp_path / 'through'}")
    import distfl.algorithms.ffc as ffc

    def crash(*args, **kwargs):
        raise RuntimeError("simulated crash in the solve")

    monkeypatch.setattr(ffc, "solve", crash)
    crashed = run_cli(["train", config, f"output.dir={tmp_path / 'crashed'}"])  # one line, exit 1 (faults.py)
    assert crashed.returncode == 1 and "simulated crash" in crashed.stderr
    monkeypatch.undo()
    assert [r["round"] for r in metrics(tmp_path / "crashed")] == list(range(1, 7))
    proc = run_cli(["train", "--resume", tmp_path / "crashed"])
    assert proc.returncode == 0, proc.stderr
    assert "after training" in proc.stderr and "round 1/" not in proc.stderr
    resumed = summary(tmp_path / "crashed")
    assert resumed["model_sha256"] == through["model_sha256"]
    assert resumed["phases"]["ffc"]["test_acc"] == through["phases"]["ffc"]["test_acc"]
    rows = metrics(tmp_path / "crashed")
    assert [r["round"] for r in rows] == list(range(1, 8)) and rows[-1]["phase"] == "ffc"
    assert resumed["collectives"]["calls"].get("round_stats", 0) == 0  # no training round was rerun


def test_calibrate_a_finished_run_equals_calibrating_in_it(tmp_path):
    config = write_config(tmp_path / "c.yaml")
    within = train_ok(config, f"output.dir={tmp_path / 'within'}", "calibration.method=ffc", "calibration.ridge=0.01")
    train_ok(config, f"output.dir={tmp_path / 'later'}")
    proc = run_cli(["calibrate", tmp_path / "later", "calibration.ridge=0.01"])
    assert proc.returncode == 0, proc.stderr
    assert summary(tmp_path / "later")["model_sha256"] == within["model_sha256"]
    proc = run_cli(["calibrate", tmp_path / "later", "calibration.ridge=1"])
    assert proc.returncode == 2 and "cannot change" in proc.stderr


def test_calibrate_needs_a_checkpointed_model(tmp_path):
    proc = run_cli(["calibrate", tmp_path / "nothing"])
    assert proc.returncode == 2 and "not a distfl run directory" in proc.stderr
    run = tmp_path / "unfinished"
    run.mkdir()
    (run / "config.yaml").write_text((write_config(tmp_path / "c.yaml")).read_text())
    proc = run_cli(["calibrate", run])
    assert proc.returncode == 2 and "no checkpointed model to calibrate" in proc.stderr


def test_head_and_calibration_keys_are_validated(tmp_path, small_config):
    for override, message in [("model.head=spherical", "did you mean 'sphere'"),
                              ("calibration.method=ffd", "did you mean 'ffc'"),
                              ("calibration.ridge=-1", "calibration.ridge must be >= 0")]:
        proc = run_cli(["train", small_config, override, f"output.dir={tmp_path / 'x'}"])
        assert proc.returncode == 2 and message in proc.stderr


def test_ffc_on_the_last_cohort_only_uses_those_clients(tmp_path):
    config = write_config(tmp_path / "c.yaml", calibration={"method": "ffc", "ridge": 0.01, "clients": "last_cohort"})
    out = train_ok(config, f"output.dir={tmp_path / 'r'}")
    from distfl.config import load_config
    from distfl.data.datasets import load_dataset
    from distfl.data.partition import partition
    from distfl.federation.population import Population

    cfg = load_config(str(tmp_path / "r" / "config.yaml"))
    labels = load_dataset(cfg.data, cfg.seed).train_y.numpy()
    population = Population(partition(labels, cfg.partition, 10, cfg.seed), labels, 10)
    cohort = population.cohort(cfg.seed, cfg.train.rounds, cfg.train.clients_per_round, cfg.train.cohort)
    ffc = out["phases"]["ffc"]
    assert ffc["clients"] == len(cohort) == 5
    assert ffc["samples"] == sum(int(population.sizes[k]) for k in cohort) < len(labels)


def test_feature_norm_and_loss_keys_apply_to_any_head():
    model = build_model(ModelConfig(name="mlp", feature_norm="on", loss="mse"), (1, 8, 8), 10)
    x = torch.randn(4, 1, 8, 8)
    assert torch.allclose(model.represent(x).norm(dim=1), torch.ones(4), atol=1e-6)
    assert model.loss_kind == "mse" and isinstance(model.head, torch.nn.Linear)
    sphere_unnormalised = build_model(ModelConfig(name="mlp", head="sphere", feature_norm="off", loss="ce"), (1, 8, 8), 10)
    assert not sphere_unnormalised.feature_norm and sphere_unnormalised.loss_kind == "ce"


def test_ffc_feature_batch_size_does_not_change_the_result(tmp_path):
    config = write_config(tmp_path / "c.yaml", model=SPHERE, calibration={"method": "ffc", "ridge": 0.01})
    default = train_ok(config, f"output.dir={tmp_path / 'a'}")
    small = train_ok(config, f"output.dir={tmp_path / 'b'}", "calibration.batch_size=7")
    a = torch.load(tmp_path / "a" / STATS_FILE)["weight_t"]
    b = torch.load(tmp_path / "b" / STATS_FILE)["weight_t"]
    # The features are a float32 forward pass, whose rounding depends on the batch shape: measured 1e-8.
    assert float((a - b).norm() / a.norm()) < 1e-6
    assert default["phases"]["ffc"]["samples"] == small["phases"]["ffc"]["samples"]


def test_mse_sum_is_mean_at_c_times_the_lr(tmp_path):
    """The MSE reduction over classes only rescales the gradient by C: training with `sum` at (lr, wd)
    is training with `mean` at (C lr, wd / C), momentum included, up to float round-off. So no run can
    prefer one reduction at a matched effective lr; the default `mean` is kept (torch's MSELoss)."""
    def trained(name, *overrides):
        trainer = build_trainer(sphere_config(tmp_path), tmp_path / name, "train.momentum=0.9", *overrides)
        for t in (1, 2, 3):
            trainer.run_round(t)
        return trainer.global_params

    total = trained("sum", "model.mse_reduction=sum", "train.lr=0.01", "train.weight_decay=1e-3")
    mean = trained("mean", "model.mse_reduction=mean", "train.lr=0.1", "train.weight_decay=1e-4")
    unmatched = trained("mean_same_lr", "model.mse_reduction=mean", "train.lr=0.01", "train.weight_decay=1e-3")
    assert torch.allclose(total, mean, rtol=0, atol=1e-5)
    assert (total - unmatched).abs().max() > 1e-2

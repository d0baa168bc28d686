"""FedADC, FedADC+ and SlowMo (fedadc.md): the paper's identities on real rounds, the hooks, the
self-confidence targets, distribution/resume invariants and config errors."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, build_trainer, record_client_models, summary, train_ok, write_config
from distfl.algorithms.fedadc import confidence, kd_loss, self_confidence_targets
from distfl.errors import ConfigError

LR = 0.1  # SMALL's train.lr


FEDADC = ["algorithm.name=fedadc", "algorithm.beta_local=0.8", "algorithm.beta_global=0.8"]


# ---- 1, 2: beta_local = beta_global, alpha = 1: the server step is the client average ----------------
@pytest.mark.parametrize("variant,weighting", [("nesterov", "samples"), ("heavy_ball", "uniform")])
def test_equal_betas_server_model_is_the_average_of_client_models(tmp_path, small_config, variant, weighting):
    trainer = build_trainer(small_config, tmp_path / "adc", *FEDADC, f"algorithm.variant={variant}",
                            f"algorithm.weighting={weighting}")
    seen = record_client_models(trainer)
    for t in range(1, 5):
        theta = trainer.global_params.clone()
        seen.clear()
        trainer.run_round(t)
        weights = [w for _, w in seen]
        assert sum(weights) == pytest.approx(1.0)
        if weighting == "uniform":
            assert all(w == pytest.approx(1 / len(seen)) for w in weights)
        average = sum(p.double() * w for p, w in seen)
        assert torch.allclose(trainer.global_params.double(), average, atol=1e-6, rtol=0)
        # Identity 2: m_{t+1} = (theta_t - theta_{t+1}) / eta.
        m_from_models = (theta.double() - trainer.global_params.double()) / LR
        assert torch.allclose(trainer.algorithm.m.double(), m_from_models, atol=2e-5, rtol=1e-5)
        assert trainer.algorithm.m.abs().max() > 0
        assert trainer.algorithm.round_metrics["momentum_norm"] == pytest.approx(float(trainer.algorithm.m.norm()))


def test_unequal_betas_follow_the_server_rule(tmp_path, small_config):
    """m_{t+1} = Delta_bar + (beta_g - beta_l) m_t and theta_{t+1} = theta_t - alpha eta m_{t+1}."""
    bl, bg, alpha = 0.5, 0.9, 0.7
    trainer = build_trainer(small_config, tmp_path / "adc", "algorithm.name=fedadc", f"algorithm.beta_local={bl}",
                            f"algorithm.beta_global={bg}", f"algorithm.server_alpha={alpha}")
    seen = record_client_models(trainer)
    for t in range(1, 4):
        theta, m = trainer.global_params.double(), trainer.algorithm.m.double()
        seen.clear()
        trainer.run_round(t)
        delta_bar = sum((theta - p.double()) * w for p, w in seen) / LR
        m_new = delta_bar + (bg - bl) * m
        assert torch.allclose(trainer.algorithm.m.double(), m_new, atol=1e-5, rtol=1e-5)
        assert torch.allclose(trainer.global_params.double(), theta - alpha * LR * m_new, atol=1e-6, rtol=0)


# ---- 3: round 1 (m_0 = 0) is FedAvg, bit for bit ---------------------------------------------------------
@pytest.mark.parametrize("extra", [["algorithm.variant=nesterov"], ["algorithm.variant=heavy_ball"],
                                   ["algorithm.beta_local=0.3", "algorithm.server_alpha=0.5"]])
def test_round_one_is_fedavg_bit_for_bit(tmp_path, small_config, extra):
    avg = build_trainer(small_config, tmp_path / "avg")
    adc = build_trainer(small_config, tmp_path / "adc", "algorithm.name=fedadc", *extra)
    assert torch.equal(avg.global_params, adc.global_params)
    avg.run_round(1)
    adc.run_round(1)
    if "algorithm.server_alpha=0.5" in extra:  # alpha scales the first step, nothing else differs
        start = build_trainer(small_config, tmp_path / "start").global_params.double()
        assert torch.allclose(adc.global_params.double() - start, 0.5 * (avg.global_params.double() - start),
                              atol=1e-7, rtol=0)
    else:
        assert torch.equal(avg.global_params, adc.global_params)


# ---- 4: the local steps with a non-zero gradient, against the paper's updates written out ----------------
def _local_models_on_a_quadratic(tmp_path, small_config, monkeypatch, variant, curvature, target, m, fixed_steps):
    """One real round (the runtime's local loop) with the loss 0.5 sum_j c_j (w_j - a_j)^2, whose
    gradient c (w - a) is known; returns [(client, H_i, client model)] and the round's start theta.
    fixed_steps: train.local_steps (0: one epoch)."""
    trainer = build_trainer(small_config, tmp_path / variant, *FEDADC, f"algorithm.variant={variant}",
                            f"train.local_steps={fixed_steps}")
    alg = trainer.algorithm

    def quadratic(model, x, y, run):
        w = torch.cat([q.reshape(-1) for q in model.parameters()])
        return 0.5 * (curvature * (w - target) ** 2).sum()

    monkeypatch.setattr(alg, "local_loss", quadratic)
    seen = []
    inner = alg.client_statistics

    def recording(run, worker, stats):
        # H_i: the fixed local steps, or one epoch of batch 16 (SMALL)
        assert run.steps == (fixed_steps or -(-run.num_samples // 16))
        seen.append((run.client_id, run.steps, worker.params.detach().clone()))
        inner(run, worker, stats)

    alg.client_statistics = recording
    alg.m.copy_(m)
    theta = trainer.global_params.clone()
    trainer.run_round(1)
    assert len(seen) == 5
    return seen, theta


@pytest.mark.parametrize("fixed_steps", [0, 8, 23], ids=["one_epoch", "H=8", "H=23_past_one_pass"])
def test_nesterov_and_heavy_ball_local_steps_with_a_nonzero_gradient(tmp_path, small_config, monkeypatch,
                                                                      fixed_steps):
    """Algorithm 3 with m_bar = beta_local m / H_i, float64 by hand:
    nesterov (consecutive):    w <- w - eta m_bar;  w <- w - eta grad f(w)
    heavy ball (simultaneous): w <- w - eta (grad f(w) + m_bar)
    With a zero gradient both move by eta beta m; here grad f(w) = c (w - a), so they differ."""
    beta = 0.8
    g = torch.Generator().manual_seed(1)
    n = build_trainer(small_config, tmp_path / "size").global_params.numel()
    curvature, target, m = torch.rand(n, generator=g) + 0.5, torch.randn(n, generator=g), torch.randn(n, generator=g)
    c, a = curvature.double(), target.double()
    models = {}
    for variant in ("nesterov", "heavy_ball"):
        seen, theta = _local_models_on_a_quadratic(tmp_path, small_config, monkeypatch, variant, curvature, target, m,
                                                   fixed_steps)
        for _, steps, params in seen:
            w, m_bar = theta.double(), beta * m.double() / steps
            for _ in range(steps):
                if variant == "nesterov":
                    w = w - LR * m_bar
                    w = w - LR * c * (w - a)
                else:
                    w = w - LR * (c * (w - a) + m_bar)
            # float32 round-off of the loop (measured under 1e-6); the variants differ by ~1e-2
            assert torch.allclose(params.double(), w, atol=5e-6, rtol=0), (variant, steps)
        models[variant] = {client: params for client, _, params in seen}
        monkeypatch.undo()
    # Same clients, same H_i: the two variants differ by about eta^2 beta c m (summed over the steps).
    assert models["nesterov"].keys() == models["heavy_ball"].keys()
    gap = min(float((models["nesterov"][k] - models["heavy_ball"][k]).abs().max()) for k in models["nesterov"])
    assert gap > 1e-3


# ---- 5: SlowMo ------------------------------------------------------------------------------------------
def test_slowmo_is_fedadc_with_beta_local_zero(tmp_path, small_config):
    slowmo = train_ok(small_config, f"output.dir={tmp_path / 'slowmo'}", "algorithm.name=slowmo",
                      "algorithm.beta_global=0.7")
    adc = train_ok(small_config, f"output.dir={tmp_path / 'adc'}", "algorithm.name=fedadc",
                   "algorithm.beta_local=0", "algorithm.beta_global=0.7")
    avg = train_ok(small_config, f"output.dir={tmp_path / 'avg'}")
    assert slowmo["model_sha256"] == adc["model_sha256"]
    assert slowmo["model_sha256"] != avg["model_sha256"]


def test_slowmo_without_momentum_is_fedavg(tmp_path, small_config):
    runs = {name: build_trainer(small_config, tmp_path / name, *overrides) for name, overrides in
            {"avg": [], "slowmo": ["algorithm.name=slowmo", "algorithm.beta_global=0"]}.items()}
    for t in range(1, 4):
        for trainer in runs.values():
            trainer.run_round(t)
    assert torch.allclose(runs["avg"].global_params, runs["slowmo"].global_params, atol=1e-7, rtol=0)


# ---- 6, 7: 1 rank == 2 ranks; one collective per round ---------------------------------------------------
DISTRIBUTED = {
    "fedadc_nesterov": ["algorithm.name=fedadc", "algorithm.variant=nesterov"],
    "fedadc_heavy_ball_kd": ["algorithm.name=fedadc", "algorithm.variant=heavy_ball", "algorithm.kd_lambda=0.35",
                             "algorithm.kd_temperature=2"],
    "slowmo": ["algorithm.name=slowmo", "algorithm.beta_global=0.8"],
}


def _distributed_worker(root: str) -> None:
    """Under torchrun: run every DISTRIBUTED config, one after another, in the same gloo process group
    (what `distfl train` does per launch, minus two of three interpreter and torch start-ups)."""
    from distfl import dist
    from distfl.config import load_config
    from distfl.federation.runner import Trainer

    ctx = dist.init("cpu", 1)
    try:
        for name, args in DISTRIBUTED.items():
            cfg = load_config(str(Path(root) / "small.yaml"), [*args, f"output.dir={Path(root) / name / 'two'}"])
            Trainer(cfg, ctx).run()
    finally:
        dist.shutdown(ctx)


@pytest.fixture(scope="module")
def two_rank_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fedadc_dist")
    config = write_config(root / "small.yaml")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, str(root)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"2-rank runs failed:\n{proc.stdout}\n{proc.stderr}"
    out = {}
    for name, args in DISTRIBUTED.items():
        out[name] = {"one": train_ok(config, f"output.dir={root / name / 'one'}", *args),
                     "two": summary(root / name / "two")}
    return out


@pytest.mark.parametrize("name", list(DISTRIBUTED))
def test_one_rank_equals_two_ranks(two_rank_runs, name):
    one, two = two_rank_runs[name]["one"], two_rank_runs[name]["two"]
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert one["status"] == two["status"] == "completed"
    assert one["model_sha256"] == two["model_sha256"]
    assert one["final_test_acc"] == two["final_test_acc"]


@pytest.mark.parametrize("name", list(DISTRIBUTED))
def test_exactly_one_collective_per_round(two_rank_runs, name):
    calls = two_rank_runs[name]["two"]["collectives"]["calls"]
    assert calls["round_stats"] == 6  # SMALL: 6 rounds, m needs no collective of its own
    assert calls["eval"] == 2
    assert "all_gather" not in calls and "broadcast" not in calls


# ---- 8: resume ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [["algorithm.variant=nesterov"],
                                   ["algorithm.variant=heavy_ball", "algorithm.kd_lambda=0.35"]])
def test_resume_equals_uninterrupted(tmp_path, extra):
    config = write_config(tmp_path / "c.yaml", train={"rounds": 4},
                          checkpoint={"every": 2, "keep": 5})
    args = ["algorithm.name=fedadc", *extra]
    straight = train_ok(config, f"output.dir={tmp_path / 'straight'}", "train.rounds=6", *args)
    first = train_ok(config, f"output.dir={tmp_path / 'resumed'}", *args)
    assert first["rounds"] == 4 and first["model_sha256"] != straight["model_sha256"]
    resumed = train_ok(config, "train.rounds=6", resume=str(tmp_path / "resumed"))
    assert resumed["model_sha256"] == straight["model_sha256"]


def test_momentum_is_checkpointed(tmp_path, small_config):
    trainer = build_trainer(small_config, tmp_path / "adc", "algorithm.name=fedadc")
    trainer.run_round(1)
    trainer.run_round(2)
    state = trainer.algorithm.server_state()
    assert torch.equal(state["m"], trainer.algorithm.m) and state["m"].abs().max() > 0
    other = build_trainer(small_config, tmp_path / "other", "algorithm.name=fedadc").algorithm
    other.load_server_state(state)
    assert torch.equal(other.m, trainer.algorithm.m)


# ---- 9: bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["fedadc", "slowmo"])
@pytest.mark.parametrize("override,key", [("server.optimizer=adam", "server.optimizer"),
                                          ("server.lr=0.5", "server.lr"),
                                          ("server.momentum=0.9", "server.momentum"),
                                          ("train.momentum=0.9", "train.momentum"),
                                          ("aggregation.mask=gma", "aggregation.mask")])
def test_bad_combinations_are_refused(tmp_path, small_config, name, override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as err:
        build_trainer(small_config, tmp_path / "bad", f"algorithm.name={name}", override)
    if key.startswith("server"):
        assert "algorithm.options.server_alpha" in str(err.value)


def test_beta_local_one_is_out_of_range(small_config):
    from distfl.config import load_config

    with pytest.raises(ConfigError, match=r"algorithm\.options\.beta_local must be in \[0, 1\), got 1\.0"):
        load_config(str(small_config), ["algorithm.name=fedadc", "algorithm.beta_local=1.0"])


# ---- 10: FedADC+ self-confidence targets ----------------------------------------------------------------
def test_confidence_from_the_label_histogram():
    assert confidence([8, 2, 0]).tolist() == [[1.0, 0.25, 0.0]]
    rho = confidence([[8, 2, 0], [0, 0, 5], [0, 0, 0]])
    assert rho.tolist() == [[1.0, 0.25, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]


def test_self_confidence_targets_eqs_8_9():
    rho = confidence([8, 2, 0])[0]
    teacher = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]])
    y = torch.tensor([1, 0])
    target = self_confidence_targets(teacher, y, rho)
    # Sample 0, true class 1: class 0 (rho 1) gets 0, class 2 (rho 0) keeps the teacher's 0.2.
    expected0 = torch.tensor([(1 - 1.0) * 0.5, 1 - (0.0 + 0.2), (1 - 0.0) * 0.2])
    # Sample 1, true class 0: class 1 (rho 0.25) gets 0.75 * 0.6, class 2 gets 0.3.
    expected1 = torch.tensor([1 - (0.45 + 0.3), 0.75 * 0.6, 0.3])
    assert torch.allclose(target, torch.stack([expected0, expected1]), atol=1e-7)
    assert torch.allclose(target.sum(1), torch.ones(2), atol=1e-7)
    assert (target >= 0).all()
    # iid-like client (every rho = 1): one-hot targets; absent classes (rho = 0) keep the teacher's mass.
    assert torch.equal(self_confidence_targets(teacher, y, torch.ones(3)), F.one_hot(y, 3).float())


def test_kd_with_one_hot_targets_and_unit_temperature_is_cross_entropy():
    torch.manual_seed(0)
    logits, y = torch.randn(6, 4), torch.randint(0, 4, (6,))
    target = F.one_hot(y, 4).float()
    assert kd_loss(logits, target, 1.0).item() == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)
    # tau^2 scaling and the temperature on the student side: KL(p_hat || softmax(z / tau)) * tau^2.
    soft = torch.softmax(torch.randn(6, 4), 1)
    manual = (soft * (soft.log() - F.log_softmax(logits / 3, 1))).sum(1).mean() * 9
    assert kd_loss(logits, soft, 3.0).item() == pytest.approx(manual.item(), rel=1e-5)


def test_fedadc_plus_changes_training_and_the_teacher_is_the_global_model(tmp_path, small_config):
    plain = build_trainer(small_config, tmp_path / "plain", "algorithm.name=fedadc")
    plus = build_trainer(small_config, tmp_path / "plus", "algorithm.name=fedadc", "algorithm.kd_lambda=0.35")
    for t in (1, 2, 3):
        plain.run_round(t)
        start = plus.global_params.clone()
        plus.run_round(t)
        # The teacher holds the global model the round started from, not the one after its server step.
        assert plus.algorithm._teacher_key[0] == t
        assert torch.equal(plus.algorithm.teacher.params, start)
        assert not torch.equal(plus.algorithm.teacher.params, plus.global_params)
    assert not torch.allclose(plain.global_params, plus.global_params, atol=1e-4)
    # The teacher never trains.
    assert all(not p.requires_grad for p in plus.algorithm.teacher.module.parameters())


if __name__ == "__main__":  # the torchrun entry point of `two_rank_runs`
    _distributed_worker(sys.argv[1])

"""User-level central DP (distfl/privacy): clipping, keyed noise, Poisson cohorts, the accountant, the
refusals. Each test would fail with its part of the mechanism broken."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

import dp_accounting
from dp_accounting import pld, rdp

from conftest import metrics, run_cli, train_ok
from distfl import dist
from distfl.config import load_config
from distfl.federation import runner
from distfl.federation.aggregate import Segment, StatBuffer
from distfl.federation.population import Population, place
from distfl.privacy import accountant
from distfl.privacy.adaptive import update_noise_multiplier
from distfl.privacy.mechanism import GaussianMechanism

@pytest.fixture(autouse=True)
def quiet_absl():
    """dp-accounting's absl warnings (unconverged RDP orders) would make logging bind a root handler to
    this test's captured stderr, which later tests find closed."""
    with accountant._quiet_absl():
        yield


DP = ["privacy.mechanism=gaussian", "privacy.delta=1e-3", "algorithm.weighting=uniform"]


def _trainer(config, tmp_path, *overrides):
    cfg = load_config(str(config), [*overrides, f"output.dir={tmp_path / 'run'}"])
    return runner.Trainer(cfg, dist.init("cpu", 1))


# ---- Poisson cohorts ---------------------------------------------------------------------------------

def test_poisson_cohort_is_keyed_and_has_the_expected_size():
    pop = Population([np.arange(i, i + 1) for i in range(200)])
    sizes = [len(pop.cohort(7, t, 10, "poisson")) for t in range(1, 2001)]
    assert pop.cohort(7, 5, 10, "poisson") == pop.cohort(7, 5, 10, "poisson")
    assert pop.cohort(7, 5, 10, "poisson") != pop.cohort(8, 5, 10, "poisson")
    # Binomial(200, 0.05): mean 10, std sqrt(9.5); the mean of 2000 rounds is within 5 standard errors.
    assert abs(np.mean(sizes) - 10) < 5 * math.sqrt(9.5 / 2000)
    assert np.var(sizes) == pytest.approx(9.5, rel=0.15)
    assert min(sizes) < 4 and max(sizes) > 16  # sizes vary: neither fixed nor capped at the expected size
    # Each client is included in a fraction q of the rounds, independently of the others.
    counts = np.zeros(200)
    for t in range(1, 2001):
        counts[pop.cohort(7, t, 10, "poisson")] += 1
    assert abs(counts.mean() / 2000 - 0.05) < 0.002


def test_placement_copes_with_empty_and_oversized_cohorts():
    sizes = np.arange(1, 13)
    assert place([], sizes, 2, sticky=False) == [[], []]
    big = list(range(12))  # more clients than clients_per_round
    assert sorted(sum(place(big, sizes, 3, sticky=False), [])) == big


def test_a_run_with_empty_poisson_rounds_completes(tmp_path, small_config):
    # 2 of 12 clients per round on average: round 2 samples nobody, round 8 twice the expected number.
    sizes = [len(Population([np.arange(1)] * 12).cohort(3, t, 2, "poisson")) for t in range(1, 9)]
    assert sizes[1] == 0 and sizes[7] == 4
    common = ["train.cohort=poisson", "train.clients_per_round=2", "train.rounds=8"]
    plain = train_ok(small_config, f"output.dir={tmp_path / 'plain'}", *common)
    private = train_ok(small_config, f"output.dir={tmp_path / 'dp'}", *common, *DP, "privacy.noise_multiplier=0.5")
    assert plain["status"] == private["status"] == "completed"
    assert plain["model_sha256"] != private["model_sha256"]


# ---- clipping --------------------------------------------------------------------------------------

def test_every_contribution_has_norm_at_most_clip_norm(tmp_path, small_config, monkeypatch):
    clip = 0.05
    added = []  # (weight, what the client's add put into the delta segment, as the sum holds it)

    class Recording(StatBuffer):
        def add(self, name, value, weight=1.0):
            # Until `reduce` a fixed segment's sum is float64 grid units (federation/aggregate.py).
            before = self._sum_view(name).clone() if name == "delta" else None
            super().add(name, value, weight)
            if name == "delta":
                units = self._sum_view(name) - before
                added.append((weight, units * 2.0 ** -self.bits[name]))

    monkeypatch.setattr(runner, "StatBuffer", Recording)
    trainer = _trainer(small_config, tmp_path, *DP, "train.cohort=poisson", "privacy.noise_multiplier=1",
                       f"privacy.clip_norm={clip}")
    raw = []  # the client's unclipped update, recorded before the mechanism sees it
    inner = trainer.algorithm.client_statistics

    def recording(run, worker, stats):
        raw.append(worker.params.detach().double() - run.global_params.double())
        inner(run, worker, stats)

    trainer.algorithm.client_statistics = recording
    for t in range(1, 4):
        trainer.run_round(t)
    assert len(added) == len(raw) > 5
    clipped = 0
    for (weight, contribution), update in zip(added, raw):
        assert weight == 1 / trainer.cfg.train.clients_per_round  # the fixed denominator
        update_as_added = contribution / weight
        assert float(update_as_added.norm()) <= clip
        if float(update.norm()) > clip:
            clipped += 1
            # clipping scales, it does not turn: the same direction
            cos = float(update_as_added @ update / (update_as_added.norm() * update.norm()))
            assert cos > 1 - 1e-9
            assert float(update_as_added.norm()) > clip * (1 - 1e-6)
    assert clipped > 0


def test_noise_zero_and_a_clip_never_reached_is_the_non_private_run(tmp_path, small_config):
    plain = train_ok(small_config, f"output.dir={tmp_path / 'plain'}", "algorithm.weighting=uniform")
    private = train_ok(small_config, f"output.dir={tmp_path / 'dp'}", *DP, "privacy.noise_multiplier=0",
                       "privacy.clip_norm=1e6")
    assert private["model_sha256"] == plain["model_sha256"]
    assert private["privacy"]["epsilon"] is None  # no noise: no finite guarantee
    # ... and the clip does act when reached.
    clipped = train_ok(small_config, f"output.dir={tmp_path / 'clip'}", *DP, "privacy.noise_multiplier=0",
                       "privacy.clip_norm=0.01")
    assert clipped["model_sha256"] != plain["model_sha256"]


# ---- noise -----------------------------------------------------------------------------------------

class _Zeros:
    def __init__(self, numel):
        self.numel = numel

    def __getitem__(self, name):
        return torch.zeros(self.numel if name == "delta" else 1, dtype=torch.float64)


def _mechanism(small_config, *overrides, numel=200_000):
    cfg = load_config(str(small_config), [*DP, *overrides])
    return GaussianMechanism(cfg, [Segment("delta", numel)], cfg.privacy.noise_multiplier, torch.device("cpu"))


def test_noise_std_is_z_times_clip_over_the_expected_cohort(small_config):
    z, clip, m = 1.3, 0.7, 5  # train.clients_per_round=5 in the small config
    mech = _mechanism(small_config, f"privacy.noise_multiplier={z}", f"privacy.clip_norm={clip}")
    noise = mech.privatize(_Zeros(200_000), 1)["delta"]
    expected = z * clip / m
    # 200,000 draws: the sample std is within 1% (its relative standard error is 1/sqrt(2n) = 0.16%).
    assert float(noise.std()) == pytest.approx(expected, rel=0.01)
    assert abs(float(noise.mean())) < 5 * expected / math.sqrt(200_000)
    # keyed by (seed, round): the same on every call (every rank), new each round
    assert torch.equal(noise, mech.privatize(_Zeros(200_000), 1)["delta"])
    assert not torch.equal(noise, mech.privatize(_Zeros(200_000), 2)["delta"])
    other_seed = GaussianMechanism(load_config(str(small_config), [*DP, f"privacy.noise_multiplier={z}", "seed=4"]),
                                   [Segment("delta", 200_000)], z, torch.device("cpu"))
    assert not torch.equal(noise, other_seed.privatize(_Zeros(200_000), 1)["delta"])


def test_adaptive_clipping_splits_the_noise_as_andrew_et_al_theorem_1(small_config):
    z, sigma_b = 1.0, 2.0
    z_update = update_noise_multiplier(z, sigma_b)
    # The update's Gaussian (multiplier z_update, sensitivity C) and the count's (std sigma_b,
    # sensitivity 1/2) compose to one Gaussian of multiplier z: 1/z^2 = 1/z_u^2 + (1/2 / sigma_b)^2.
    assert z_update ** -2 + (0.5 / sigma_b) ** 2 == pytest.approx(z ** -2, rel=1e-12)
    mech = _mechanism(small_config, f"privacy.noise_multiplier={z}", "privacy.adaptive_clip=true",
                      f"privacy.count_noise_multiplier={sigma_b}", "privacy.clip_norm=1.0", "privacy.clip_lr=0.2",
                      "privacy.target_quantile=0.5", numel=100_000)
    assert mech.update_multiplier == z_update
    noise = mech.privatize(_Zeros(100_000), 1)["delta"]
    assert float(noise.std()) == pytest.approx(z_update * 1.0 / 5, rel=0.02)
    # C_{t+1} = C_t exp(-eta (b - gamma)), b the noised fraction (the zero sum here: every report
    # b_i - 1/2 summed to 0, i.e. half the clients unclipped, plus the count's noise).
    b = mech.metrics["privacy_unclipped_fraction"]
    assert mech.clip_norm == pytest.approx(math.exp(-0.2 * (b - 0.5)), rel=1e-12)
    assert mech.metrics["privacy_clip_norm"] == 1.0  # the clip the round used


def test_adaptive_clip_moves_towards_the_target_quantile(tmp_path, small_config):
    # Starting far above every update norm, every client is unclipped (b ~ 1 > gamma): the clip shrinks.
    trainer = _trainer(small_config, tmp_path, *DP, "privacy.noise_multiplier=0.01", "privacy.adaptive_clip=true",
                       "privacy.count_noise_multiplier=0.5", "privacy.clip_norm=20", "privacy.clip_lr=0.5")
    clips = []
    for t in range(1, 5):
        trainer.run_round(t)
        clips.append(trainer.privacy.clip_norm)
    assert clips == sorted(clips, reverse=True) and clips[-1] < 20 * math.exp(-0.5 * 0.3 * 4)


# ---- exactness across ranks and resume, with noise, Poisson sampling and adaptive clipping ----------

def test_private_run_is_the_same_on_one_and_two_ranks_and_resumed(tmp_path, small_config):
    private = [*DP, "train.cohort=poisson", "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.3",
               "privacy.adaptive_clip=true", "privacy.count_noise_multiplier=1", "server.momentum=0.5"]
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", *private)
    two = train_ok(small_config, f"output.dir={tmp_path / 'two'}", *private, nproc=2)
    train_ok(small_config, f"output.dir={tmp_path / 'resumed'}", *private, "train.rounds=3")
    resumed = train_ok(small_config, "train.rounds=6", resume=str(tmp_path / "resumed"))
    assert one["model_sha256"] == two["model_sha256"] == resumed["model_sha256"]
    assert one["privacy"] == two["privacy"] == resumed["privacy"]
    assert one["privacy"]["final_clip_norm"] != 0.3  # the clip moved, and was checkpointed
    rows = [metrics(tmp_path / name) for name in ("one", "two", "resumed")]
    keys = ("privacy_epsilon", "privacy_clip_norm", "privacy_unclipped_fraction")
    assert [[r[k] for k in keys] for r in rows[0]] == [[r[k] for k in keys] for r in rows[1]] == \
        [[r[k] for k in keys] for r in rows[2]]


# ---- the accountant --------------------------------------------------------------------------------

def test_logged_epsilon_is_the_library_called_directly(tmp_path, small_config):
    for cohort, kind in (("poisson", "rdp"), ("poisson", "pld"), ("random", "rdp")):
        run = tmp_path / f"{cohort}_{kind}"
        summary = train_ok(small_config, f"output.dir={run}", *DP, f"train.cohort={cohort}",
                           "privacy.noise_multiplier=1.1", f"privacy.accountant={kind}", "train.rounds=3")
        q, n, m = 5 / 12, 12, 5
        for row in metrics(run):
            if cohort == "poisson":
                event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.1))
                relation = dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
            else:  # replace-one adjacency: one client moves the clipped sum by up to 2C
                event = dp_accounting.SampledWithoutReplacementDpEvent(n, m, dp_accounting.GaussianDpEvent(0.55))
                relation = dp_accounting.NeighboringRelation.REPLACE_ONE
            acc = rdp.RdpAccountant(neighboring_relation=relation) if kind == "rdp" else \
                pld.PLDAccountant(neighboring_relation=relation)
            acc.compose(dp_accounting.SelfComposedDpEvent(event, row["round"]))
            assert row["privacy_epsilon"] == acc.get_epsilon(1e-3)
        assert summary["privacy"]["epsilon"] == metrics(run)[-1]["privacy_epsilon"]


def test_epsilon_reproduces_abadi_et_al_2016():
    # Abadi et al., "Deep Learning with Differential Privacy", CCS 2016, Sec. 3.1: sampling ratio
    # q = 0.01, sigma = 4, delta = 1e-5, T = 10000 steps give "epsilon ~ 1.26 using the moments
    # accountant" (integer moments, epsilon = min_a (RDP(a) + log(1/delta) / (a - 1))).
    orders = np.arange(2, 33)
    acc = rdp.RdpAccountant(orders=orders)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(4.0)), 10000))
    moments = float(np.min(acc.rdp + np.log(1 / 1e-5) / (orders - 1)))
    assert round(moments, 2) == 1.26
    # distfl's epsilon for the same mechanism: the library's tighter RDP-to-DP conversion, below it.
    ours = accountant.epsilon(4.0, 10000, 1e-5, "poisson", 60000, 600)
    assert 1.0 < ours < moments


@pytest.mark.parametrize("cohort,kind", [("poisson", "rdp"), ("random", "rdp"), ("poisson", "pld")])
def test_target_epsilon_calibration_lands_at_or_below_target(cohort, kind):
    target, rounds, delta, n, m = 2.0, 20, 1e-4, 3000, 100
    z = accountant.calibrate(target, rounds, delta, cohort, n, m, kind)
    spent = accountant.epsilon(z, rounds, delta, cohort, n, m, kind)
    assert spent <= target
    assert accountant.epsilon(z * (1 - 1e-3), rounds, delta, cohort, n, m, kind) > target * (1 - 1e-2)


def test_a_calibrated_run_reports_its_multiplier_and_stays_within_target(tmp_path, small_config):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'run'}", *DP, "train.cohort=poisson",
                    "privacy.target_epsilon=5", "output.tensorboard=true"])
    assert proc.returncode == 0, proc.stderr
    s = __import__("json").loads((tmp_path / "run" / "summary.json").read_text())
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tb"))
    events.Reload()
    logged = [e.value for e in events.Scalars("privacy/epsilon")]
    assert logged == pytest.approx([r["privacy_epsilon"] for r in metrics(tmp_path / "run")], rel=1e-6)
    assert len(logged) == 6 and logged == sorted(logged)
    assert s["privacy"]["calibrated"] and s["privacy"]["epsilon"] <= 5
    assert f"noise multiplier {s['privacy']['noise_multiplier']:.4g} (calibrated by rdp" in proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("privacy: user-level (epsilon, delta)-DP with epsilon") and "delta 0.001" in last


# ---- refusals, before any work ---------------------------------------------------------------------

REFUSED = [
    (["algorithm.name=scaffold"], "control-variate"),
    (["algorithm.name=feddyn"], "delta_over_n"),
    (["algorithm.name=fednova"], "tau_eff"),
    (["algorithm.name=tct"], "TCT releases"),
    (["aggregation.mask=gma"], "sign counts"),
    (["model.name=resnet18", "model.norm=bn", "data.synthetic_channels=3", "data.synthetic_image_size=32"],
     "BatchNorm"),
    (["aggregation.fedbn=true"], "fedbn"),
    (["calibration.method=ffc"], "Z^T Z"),
    (["eval.clients=true"], "eval.clients"),
    (["train.cohort=sequential"], "no accountant"),
    (["train.cohort=random", "privacy.accountant=pld"], "Poisson sampling only"),
    (["algorithm.weighting=samples"], "sample counts"),
    (["privacy.delta=0"], "1/num_clients^1.1 = 0.065"),
    (["privacy.target_epsilon=2"], "exactly one of"),
    (["privacy.noise_multiplier=-1"], "exactly one of"),
    (["privacy.adaptive_clip=true", "privacy.noise_multiplier=5", "privacy.count_noise_multiplier=1"],
     "must exceed noise_multiplier / 2"),
]


@pytest.mark.parametrize("overrides,why", REFUSED, ids=[r[1] for r in REFUSED])
def test_refusals_fail_before_any_work(tmp_path, small_config, overrides, why):
    run = tmp_path / "run"
    proc = run_cli(["train", str(small_config), f"output.dir={run}", *DP, "privacy.noise_multiplier=1", *overrides])
    assert proc.returncode != 0
    assert why in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1  # one line
    assert not run.exists()  # nothing written: refused before any work


def test_a_plugin_method_must_declare_private_release(tmp_path, small_config):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "mymethods.py").write_text(
        "from distfl import Algorithm\n\n"
        "class Undeclared(Algorithm):\n    pass\n\n"
        "class Declared(Algorithm):\n    private_release = True\n")
    sys.path.insert(0, str(pkg))
    try:
        proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'a'}", *DP, "privacy.noise_multiplier=1",
                        "algorithm.name=mymethods:Undeclared"])
        assert proc.returncode != 0 and "private_release" in proc.stderr
        assert not (tmp_path / "a").exists()
        train_ok(small_config, f"output.dir={tmp_path / 'b'}", *DP, "privacy.noise_multiplier=1",
                 "algorithm.name=mymethods:Declared", "train.rounds=1")
    finally:
        sys.path.remove(str(pkg))
        sys.modules.pop("mymethods", None)


@pytest.mark.parametrize("name,server", [("fedavg", ["server.optimizer=adam", "server.lr=0.01"]),
                                         ("fedprox", ["server.momentum=0.9"]), ("slowmo", []), ("fedadc", []),
                                         ("fedfor", ["server.optimizer=yogi", "server.lr=0.01"])])
def test_methods_that_release_only_the_update_run_under_dp(tmp_path, small_config, name, server):
    s = train_ok(small_config, f"output.dir={tmp_path / name}", *DP, "privacy.noise_multiplier=1",
                 f"algorithm.name={name}", "train.rounds=2", *server)
    assert s["status"] == "completed" and s["privacy"]["epsilon"] > 0


def test_a_calibrated_run_cannot_resume_with_more_rounds(tmp_path, small_config):
    run = tmp_path / "run"
    train_ok(small_config, f"output.dir={run}", *DP, "train.cohort=poisson", "privacy.target_epsilon=5",
             "train.rounds=2")
    proc = run_cli(["train", "--resume", str(run), "train.rounds=4"])
    assert proc.returncode != 0 and "train.rounds" in proc.stderr
    # The message says why: the noise was calibrated to the rounds the run was started with.
    assert "train.rounds is fixed in this run: privacy.target_epsilon=5 calibrated the noise to 2 rounds" in proc.stderr

"""User-level central DP (distfl/privacy): clipping, keyed noise, Poisson cohorts, the accountant, the
refusals. Each test would fail with its part of the mechanism broken."""
from __future__ import annotations

import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import dp_accounting
from dp_accounting import pld, rdp

from conftest import assert_refused, build_trainer, metrics, run_cli, train_ok, write_config
from distfl import checkpoint, trackers as tracking
from distfl.config import load_config
from distfl.federation import runner
from distfl.federation import aggregators
from distfl.federation.aggregate import Segment, StatBuffer
from distfl.federation.population import Population, place
from distfl.privacy import accountant, banded, csprng, mechanism, secret, tree
from distfl.privacy.adaptive import update_noise_multiplier
from distfl.privacy.mechanism import GaussianMechanism

@pytest.fixture(autouse=True)
def quiet_absl():
    """dp-accounting's absl warnings (unconverged RDP orders) would make logging bind a root handler to
    this test's captured stderr, which later tests find closed."""
    with accountant._quiet_absl():
        yield


# Keyed noise (from the seed): the tests that compare runs with each other need it; SECRET ones set true.
DP = ["privacy.mechanism=gaussian", "privacy.delta=1e-3", "algorithm.weighting=uniform", "privacy.secure_noise=false"]


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

    monkeypatch.setattr(aggregators, "aggregator_class", lambda name: Recording)  # the round's aggregator
    trainer = build_trainer(small_config, tmp_path / "run", *DP, "train.cohort=poisson", "privacy.noise_multiplier=1",
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


PLUGINS = """from distfl import Algorithm

class DoubleAdd(Algorithm):
    private_release = True

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        self.add_update(stats, worker.params - run.global_params, run.weight)  # the update a second time

class DivergesAtRound5(Algorithm):
    private_release = True

    def begin_round(self, round_idx):
        super().begin_round(round_idx)
        self.round_idx = round_idx

    def server_update(self, params, buffers, reduced):
        super().server_update(params, buffers, reduced)
        if self.round_idx == 5:  # the server step blows the model up, as a far too large server.lr would
            params.mul_(float("inf"))

class WrongWeight(Algorithm):
    private_release = True

    def client_statistics(self, run, worker, stats):
        self.add_update(stats, worker.params - run.global_params, 1.0)  # not 1 / clients_per_round
        stats.add("buffers", worker.buffers, run.weight)
"""


@pytest.fixture
def dp_plugins(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "dpplugins.py").write_text(PLUGINS)
    sys.path.insert(0, str(pkg))
    yield
    sys.path.remove(str(pkg))
    sys.modules.pop("dpplugins", None)


def test_a_segment_added_twice_is_clipped_as_summed(tmp_path, small_config, dp_plugins):
    """The clip bounds what a client moves the sum by: a plugin adding its update twice has the doubled
    update clipped to C (norms over the per-segment sums), not each add (which would let sqrt(2) C through)."""
    clip = 0.05
    trainer = build_trainer(small_config, tmp_path / "run", *DP, "privacy.noise_multiplier=1",
                            f"privacy.clip_norm={clip}", "algorithm.name=dpplugins:DoubleAdd")
    summed, raw, collect = [], [], trainer.privacy.collect

    def recording(algorithm, run, worker, stats):
        before = stats._sum_view("delta").clone()
        raw.append(worker.params.detach().double() - run.global_params.double())
        norm = collect(algorithm, run, worker, stats)
        # Until `reduce` a fixed segment's sum is float64 grid units; unweighted: times m.
        m = trainer.cfg.train.clients_per_round
        summed.append((stats._sum_view("delta") - before) * 2.0 ** -stats.bits["delta"] * m)
        return norm

    trainer.privacy.collect = recording
    for t in range(1, 3):
        trainer.run_round(t)
    assert len(summed) == len(raw) > 5
    for contribution, update in zip(summed, raw):
        assert float(update.norm()) > clip  # every client clipped
        assert clip * (1 - 1e-6) < float(contribution.norm()) <= clip
        assert float(contribution @ update / (contribution.norm() * update.norm())) > 1 - 1e-9


def test_a_contribution_weighted_other_than_one_over_m_is_refused(tmp_path, small_config, dp_plugins):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'run'}", *DP, "privacy.noise_multiplier=1",
                    "algorithm.name=dpplugins:WrongWeight"])
    assert proc.returncode != 0
    assert "weighted 1 / train.clients_per_round = 0.2 (run.weight)" in proc.stderr and "weight 1;" in proc.stderr


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
    trainer = build_trainer(small_config, tmp_path / "run", *DP, "privacy.noise_multiplier=0.01",
                            "privacy.adaptive_clip=true", "privacy.count_noise_multiplier=0.5", "privacy.clip_norm=20",
                            "privacy.clip_lr=0.5")
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


# ---- secret noise (privacy.secure_noise) -------------------------------------------------------------

SECRET = [*DP[:-1], "privacy.secure_noise=true"]


def _released_round(small_config, tmp_path, secure: str):
    """Round 1 of a private FedAvg run (server sgd, lr 1): the released update (the global model after it
    minus before), the clipped sum as the server saw it before noise, and the run's config."""
    trainer = build_trainer(small_config, tmp_path / secure / "run", *DP[:-1], f"privacy.secure_noise={secure}",
                            "privacy.noise_multiplier=1.0", "privacy.clip_norm=0.3")
    seen, privatize = {}, trainer.privacy.privatize

    def spy(reduced, round_idx):
        seen["clipped"] = reduced["delta"].clone().double()
        return privatize(reduced, round_idx)

    trainer.privacy.privatize = spy
    before = trainer.global_params.detach().clone().double()
    trainer.run_round(1)
    released = trainer.global_params.double() - before
    trainer.close()
    return released, seen["clipped"], trainer.cfg


def _subtraction_attack(released, cfg):
    """What anyone with config.yaml can do to a released update: regenerate the noise from its seed (the
    mechanism's own keyed draw, std z C / m) and subtract it."""
    p = cfg.privacy
    noise = mechanism.standard_normal(secret.NoiseKey(False, cfg.seed), 1, 0, released.numel(), torch.device("cpu"))
    return released - noise * (p.noise_multiplier * p.clip_norm / cfg.train.clients_per_round)


def test_the_subtraction_attack_recovers_the_clipped_sum_in_keyed_mode_only(tmp_path, small_config):
    released, clipped, cfg = _released_round(small_config, tmp_path, "false")
    # Keyed: the released update (norm ~5.6, nearly all noise) minus the regenerated noise is the
    # clipped sum (norm ~0.14) up to the float32 rounding of the model.
    assert float(released.norm()) > 20 * float(clipped.norm())
    assert float((_subtraction_attack(released, cfg) - clipped).norm()) < 1e-5 * float(clipped.norm()) + 1e-6
    # Secret: the same attack leaves the run's noise plus the regenerated one (norm ~8), nothing like the
    # clipped sum.
    released, clipped, cfg = _released_round(small_config, tmp_path, "true")
    residual = float((_subtraction_attack(released, cfg) - clipped).norm())
    assert residual > 0.5 * float(released.norm()) and residual > 20 * float(clipped.norm())


def _resume_copy(run: Path, copy: Path, at: str) -> None:
    """`run`'s directory with only its checkpoint `at`: resuming it reruns the rounds after that one."""
    shutil.copytree(run, copy)
    ckpts = copy / "checkpoints"
    for old in ckpts.glob("round_*"):
        if old.name != at:
            shutil.rmtree(old)
    (ckpts / "latest").write_text(at + "\n")


def test_secret_noise_is_the_same_on_one_and_two_ranks_and_resumed_and_never_written_out(tmp_path, small_config):
    private = [*SECRET, "train.cohort=poisson", "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.3",
               "server.momentum=0.5", "output.tensorboard=true"]
    two = train_ok(small_config, f"output.dir={tmp_path / 'two'}", *private, nproc=2)
    assert two["privacy"]["noise"] == "secret"
    # The key: one per run, in every checkpoint, owner-only.
    keys = {p.read_text() for p in (tmp_path / "two" / "checkpoints").glob("round_*/noise_key")}
    assert len(keys) == 1 and len(list((tmp_path / "two" / "checkpoints").glob("round_*"))) == 3
    for path in (tmp_path / "two" / "checkpoints").glob("round_*/noise_key"):
        assert path.stat().st_mode & 0o777 == 0o600
    # Resumed from round 2 on one rank: rounds 3-6 drawn from the same key give the same model.
    _resume_copy(tmp_path / "two", tmp_path / "resumed", checkpoint.checkpoint_name("round", 2))
    proc = run_cli(["train", "--resume", tmp_path / "resumed"])
    assert proc.returncode == 0, proc.stderr
    resumed = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert resumed["model_sha256"] == two["model_sha256"] and resumed["privacy"] == two["privacy"]
    # Another run of the same config draws another key: other noise, another model.
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", *private)
    assert one["model_sha256"] != two["model_sha256"]
    # The key appears nowhere but in its checkpoint files: not in config.yaml, metrics, summary, logs or
    # TensorBoard, in any spelling, nor in what the runs printed.
    key = int(keys.pop().split("\n")[0], 16)  # then its check line
    spellings = [f"{key:x}".encode(), f"{key:032x}".encode(), str(key).encode(),
                 key.to_bytes(16, "little"), key.to_bytes(16, "big")]
    files = [p for p in (tmp_path / "two").rglob("*") if p.is_file() and p.name != "noise_key"]
    files += [p for p in (tmp_path / "resumed").rglob("*") if p.is_file() and p.name != "noise_key"]
    assert any(p.name == "config.yaml" for p in files) and any("tfevents" in p.name for p in files)
    for path in files:
        data = path.read_bytes()
        assert not any(s in data for s in spellings), path
    assert not any(s.decode("latin-1") in proc.stdout + proc.stderr for s in spellings)
    assert "noise secret" in proc.stderr and "noise secret" in proc.stdout


def test_secret_noise_of_a_two_rank_run_is_the_aes_stream_of_its_key(tmp_path, small_config):
    """A 2-rank run whose clients contribute nothing (train.lr 1e-30 rounds every update to 0 in the
    fixed-point sum), server sgd at lr 1 without momentum: round t moves the model by exactly
    z C / m times the Gaussians of the CSPRNG's stream (noise, update, t) under the key in its checkpoint."""
    z, clip, m, rounds = 0.8, 0.3, 5, 4
    train_ok(small_config, f"output.dir={tmp_path / 'run'}", *SECRET, "train.cohort=poisson", "train.lr=1e-30",
             "server.momentum=0", f"privacy.noise_multiplier={z}", f"privacy.clip_norm={clip}",
             f"train.rounds={rounds}", "checkpoint.every=1", "checkpoint.keep=10", nproc=2)
    ckpts = [tmp_path / "run" / "checkpoints" / checkpoint.checkpoint_name("round", t) for t in range(1, rounds + 1)]
    key = secret.read(ckpts[0])
    params = [torch.load(c / "state.pt", weights_only=True)["params"].double() for c in ckpts]
    for t in range(2, rounds + 1):
        noise = csprng.normal(key, mechanism._NOISE_STREAM, 0, t, params[0].numel(), torch.device("cpu"))
        assert float((params[t - 1] - params[t - 2] - z * clip / m * noise).abs().max()) < 1e-6  # float32 model


def test_secret_dp_ftrl_and_banded_runs_are_the_same_on_two_ranks_and_resumed_on_one(tmp_path, small_config):
    """The tree's and the banded factorisation's secret streams (keyed by the run's round): a resume from
    round 2 on one rank continues a 2-rank run's noise exactly."""
    for name in ("dp_ftrl", "banded_mf"):
        private = [*SECRET, f"privacy.mechanism={name}", "train.cohort=sequential", "train.clients_per_round=3",
                   "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.3", "server.momentum=0.5"]
        two = train_ok(small_config, f"output.dir={tmp_path / name}", *private, nproc=2)
        _resume_copy(tmp_path / name, tmp_path / f"{name}_resumed", checkpoint.checkpoint_name("round", 2))
        proc = run_cli(["train", "--resume", tmp_path / f"{name}_resumed"])
        assert proc.returncode == 0, proc.stderr
        resumed = json.loads((tmp_path / f"{name}_resumed" / "summary.json").read_text())
        assert two["privacy"]["noise"] == "secret" and resumed["model_sha256"] == two["model_sha256"]


def test_keyed_mode_says_it_is_a_simulation_where_epsilon_is_printed(tmp_path, small_config):
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'run'}", *DP, "privacy.noise_multiplier=1",
                    "output.progress=log"])
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "epsilon" in line]
    assert len(lines) == 2 and all("simulation: noise reproducible from the config" in line for line in lines)
    assert not list((tmp_path / "run" / "checkpoints").glob("*/noise_key"))
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["privacy"]["noise"] == "keyed"


def test_a_run_keeps_its_noise_mode_on_resume(tmp_path, small_config):
    """A checkpoint from before privacy.secure_noise (no mode, no key) drew keyed noise: resumed, it stays
    keyed (the saved config, which lacks the key, is read as secure_noise=false) and equals a run through."""
    private = [*DP, "privacy.noise_multiplier=1", "train.cohort=poisson"]
    through = train_ok(small_config, f"output.dir={tmp_path / 'through'}", *private)
    train_ok(small_config, f"output.dir={tmp_path / 'old'}", *private, "train.rounds=2")
    # Make it look like a run of a distfl without the key: the config and the checkpoint's state lose it.
    saved = yaml.safe_load((tmp_path / "old" / "config.yaml").read_text())
    del saved["privacy"]["secure_noise"]
    (tmp_path / "old" / "config.yaml").write_text(yaml.safe_dump(saved))
    ckpt = tmp_path / "old" / "checkpoints" / checkpoint.checkpoint_name("round", 2)
    state = torch.load(ckpt / "state.pt", weights_only=False)
    del state["privacy"]["noise"], state["config"]["privacy"]["secure_noise"]
    checkpoint.save_tensors(state, ckpt / "state.pt")
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["files"]["state.pt"] = checkpoint.file_sha256(ckpt / "state.pt")
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    # Today's default (secret) would change the noise from round 3: refused, with the way to go on.
    proc = run_cli(["train", "--resume", tmp_path / "old", "train.rounds=6"])
    assert proc.returncode != 0 and "privacy.secure_noise=false" in proc.stderr
    resumed = train_ok(small_config, "train.rounds=6", "privacy.secure_noise=false", resume=str(tmp_path / "old"))
    assert resumed["model_sha256"] == through["model_sha256"]
    # A secret run cannot be resumed as keyed (nor the other way): the noise would change mid-run.
    train_ok(small_config, f"output.dir={tmp_path / 'secret'}", *SECRET, "privacy.noise_multiplier=1", "train.rounds=2")
    proc = run_cli(["train", "--resume", tmp_path / "secret", "train.rounds=4", "privacy.secure_noise=false"])
    assert proc.returncode != 0 and "privacy.secure_noise" in proc.stderr


# ---- the release surface -------------------------------------------------------------------------------

# What a private run may release that depends on the clients' data: the noised models and what is computed
# from them alone (test metrics on the server's test set, the adaptive clip from its noised count), and
# the wall-clock times (documented as not covered).
COVERED = {"model_sha256", "final_test_acc", "final_test_loss", "best_test_acc", "best_round", "test_acc", "test_loss",
           "privacy_clip_norm", "privacy_unclipped_fraction", "privacy.final_clip_norm", "update_norm"}
# The evaluation's time: the model scored on the server's test set (no per-round time of the clients' training:
# round_s and wall_s are withheld, privacy.release_timings).
TIMING = {"eval_s"}


def _flat(value, prefix=""):
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}{key}.").items()}
    return {prefix[:-1]: value}


def _differing(a: dict, b: dict) -> set:
    assert a.keys() == b.keys()
    return {k for k in a if a[k] != b[k]}


def _tensorboard(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_a_private_run_releases_no_unnoised_statistic_of_the_clients_data(tmp_path, small_config):
    """Two private runs with the same seed (so the same keyed noise and cohorts) on different client data
    (partition.seed): every value in summary.json, metrics.jsonl and TensorBoard that differs between them
    depends on the clients' data, and must be the noised model's (COVERED) or the evaluation's time."""
    private = [*DP, "privacy.noise_multiplier=1", "privacy.clip_norm=0.3", "train.cohort=poisson",
               "privacy.adaptive_clip=true", "privacy.count_noise_multiplier=2", "output.tensorboard=true"]
    runs = [tmp_path / "a", tmp_path / "b"]
    summaries = [train_ok(small_config, f"output.dir={run}", f"partition.seed={i + 1}", *private)
                 for i, run in enumerate(runs)]
    allowed = COVERED | TIMING
    assert _differing(*(_flat(s) for s in summaries)) - allowed == set()
    rows = [metrics(run) for run in runs]
    assert len(rows[0]) == len(rows[1]) == 6
    for a, b in zip(*rows):
        assert _differing(a, b) - allowed == set()
    tags = {tracking.tag(key) for key in allowed} | {f"hparams/{key}" for key in allowed}
    boards = [_tensorboard(run) for run in runs]
    assert boards[0] and _differing(*boards) - tags == set()
    # Nor what is the same here only because both runs have the same seed and population size: a Poisson
    # cohort's size counts whether a client took part.
    assert not any("cohort_size" in tag or "samples_per_s" in tag or "train/loss" in tag for tag in boards[0])
    # The data differed, and the covered values show it (the walk compared something).
    assert summaries[0]["model_sha256"] != summaries[1]["model_sha256"]
    assert not any(key in row for row in rows[0] for key in mechanism.WITHHELD)


def test_a_private_run_logs_no_wall_clock_time_unless_asked_and_names_no_client_count(tmp_path, small_config):
    """A private Poisson run: a round's time counts its hidden cohort, so metrics.jsonl, TensorBoard (its
    scalars and the times stamped on them), summary.json and the progress line carry none, unless
    privacy.release_timings asks for them; a divergence's line names no count of clients."""
    private = [*DP, "privacy.noise_multiplier=1", "train.cohort=poisson", "output.tensorboard=true",
               "output.progress=log"]
    timings = {"round_s", "wall_s", "samples_per_s"}
    for opt_in in (False, True):
        run = tmp_path / f"timings_{opt_in}"
        proc = run_cli(["train", str(small_config), f"output.dir={run}", *private,
                        f"privacy.release_timings={str(opt_in).lower()}"])
        assert proc.returncode == 0, proc.stderr
        rows, board = metrics(run), _tensorboard(run)
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        events = EventAccumulator(str(run / "tb"))
        events.Reload()
        stamps = {e.wall_time for tag in events.Tags()["scalars"] for e in events.Scalars(tag)}
        summary = json.loads((run / "summary.json").read_text())
        if opt_in:
            assert all({"round_s", "wall_s"} <= row.keys() for row in rows)
            assert "time/round_s" in board and summary["wall_s"] > 0 and "s/round" in proc.stderr
            assert len(stamps) > 1
        else:
            assert not any(timings & row.keys() for row in rows) and len(rows) == 6
            assert not any(tag.startswith("time/") and tag != "time/eval_s" for tag in board)
            assert len(stamps) == 1  # every scalar stamped with the session's start
            assert summary["wall_s"] is None and "s/round" not in proc.stderr and "eta" not in proc.stderr
    # A divergence (every client's local model non-finite) says so without counting the clients.
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'diverged'}", *private, "train.lr=1e30"])
    assert proc.returncode != 0 and "non-finite local model parameters in the cohort" in proc.stderr
    assert "client(s)" not in proc.stderr and "term(s)" not in proc.stderr


def test_test_metrics_of_a_natural_federation_are_marked_not_covered(tmp_path, small_config):
    """FedProx's synthetic devices own their test samples (a natural federation's test split is the
    clients'): a private run on them warns at start, says so on its final line and in summary.json. The
    synthetic set's server-held test split is covered."""
    natural = write_config(tmp_path / "natural.yaml", data={"dataset": "fedprox_synthetic"},
                           partition={"scheme": "natural", "num_clients": 30}, model={"name": "mclr"},
                           train={"rounds": 2, "clients_per_round": 5, "lr": 0.01, "batch_size": 10})
    for config, covered in ((natural, False), (small_config, True)):
        run = tmp_path / f"covered_{covered}"
        proc = run_cli(["train", str(config), f"output.dir={run}", *DP, "privacy.noise_multiplier=1",
                        "train.cohort=poisson", "train.rounds=2"])
        assert proc.returncode == 0, proc.stderr
        s = json.loads((run / "summary.json").read_text())
        assert s["privacy"]["test_metrics_covered"] is covered and s["final_test_acc"] is not None
        warned = [line for line in proc.stderr.splitlines() if "the test split holds the clients' own" in line]
        assert len(warned) == (0 if covered else 1)
        last = proc.stdout.strip().splitlines()[-1]
        assert last.startswith("privacy: ") and ("test metrics not covered" in last) is not covered


def test_a_failure_in_local_training_names_no_client_of_a_hidden_cohort(tmp_path, small_config, monkeypatch):
    """A crash's line (stderr, summary.json's error) says where the run was: under DP, not which client
    trained, since the cohorts are secret."""
    def failing(*args, **kwargs):
        raise RuntimeError("a local step that fails")

    monkeypatch.setattr("distfl.federation.round.train_client", failing)
    monkeypatch.setattr("distfl.federation.round.pack_statistics", lambda algorithm: False)
    run = tmp_path / "run"
    proc = run_cli(["train", str(small_config), f"output.dir={run}", *DP, "privacy.noise_multiplier=1",
                    "train.cohort=poisson"])
    error = json.loads((run / "summary.json").read_text())["error"]
    assert proc.returncode != 0 and "round 1, local training of a sampled client" in error
    assert "client " not in error.replace("a sampled client", "") and "client " not in proc.stderr.replace(
        "a sampled client", "")


def test_wandb_is_refused_in_a_private_run_that_withholds_timings(tmp_path, small_config):
    assert_refused(small_config, tmp_path / "run", [*DP, "privacy.noise_multiplier=1", "output.trackers=wandb"],
                   "privacy.release_timings=true")


# ---- DP-FTRL: tree aggregation with restarts (Kairouz et al. 2021) ------------------------------------

FTRL = [*DP, "privacy.mechanism=dp_ftrl", "train.cohort=sequential"]


def test_tree_noise_on_each_prefix_sum_has_the_variance_of_the_tree_theorem():
    """The noise on the prefix sum of rounds 1..j of a tree is the sum of the popcount(j) nodes of its
    dyadic decomposition: variance popcount(j) sigma^2 <= ceil(log2(j + 1)) sigma^2 (Kairouz et al., Sec. 3);
    the rounds' released noises add up to it exactly; a restart starts a fresh tree."""
    agg, n, key = tree.TreeAggregation(16), 100_000, secret.NoiseKey(False, 5)
    running = torch.zeros(n, dtype=torch.float64)
    for j in range(1, 17):
        running += agg.round_noise(key, j, n, torch.device("cpu"))
        prefix = agg.prefix_noise(key, j, n, torch.device("cpu"))
        assert float((running - prefix).abs().max()) < 1e-12
        assert len(tree.nodes(j)) == bin(j).count("1") <= math.ceil(math.log2(j + 1))
        # 100,000 draws: the sample variance is within 3% (relative standard error sqrt(2/n) = 0.45%).
        assert float(prefix.var()) == pytest.approx(bin(j).count("1"), rel=0.03)
    # Round 17 opens the second tree: its noise is one fresh node (variance 1), independent of tree 0's.
    first = agg.round_noise(key, 17, n, torch.device("cpu"))
    assert torch.equal(first, agg.prefix_noise(key, 17, n, torch.device("cpu")))
    assert float(first.var()) == pytest.approx(1, rel=0.03)
    assert abs(float(first @ agg.prefix_noise(key, 1, n, torch.device("cpu")))) / n < 0.02


def test_dp_ftrl_noise_through_the_mechanism_is_z_c_over_m_per_node(small_config):
    z, clip, m = 1.3, 0.7, 3  # 12 clients, 3 a round: a tree every 4 rounds
    mech = _mechanism(small_config, *FTRL[len(DP):], f"privacy.noise_multiplier={z}", f"privacy.clip_norm={clip}",
                      "train.clients_per_round=3", numel=100_000)
    assert mech.tree.rounds_per_tree == 4
    released = [mech.privatize(_Zeros(100_000), t)["delta"] for t in range(1, 5)]
    prefix = torch.stack(released).cumsum(0)
    for j in range(1, 5):
        assert float(prefix[j - 1].std()) == pytest.approx(z * clip / m * math.sqrt(bin(j).count("1")), rel=0.03)


def test_dp_ftrl_epsilon_is_the_tree_restart_analysis():
    """Kairouz et al., App. D: a tree of L rounds in which each client appears once is a Gaussian
    mechanism of sensitivity C sqrt(ceil(log2(L + 1))) and noise z C per node, so E trees give
    RDP(alpha) = E alpha ceil(log2(L + 1)) / (2 z^2); epsilon from it by dp-accounting's conversion."""
    n, m, z, delta = 3000, 100, 2.0, 1e-5  # L = 30 rounds per tree (one epoch), depth ceil(log2 31) = 5
    orders = np.array(rdp.rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
    for rounds in (30, 90, 100):
        full, rest = divmod(rounds, 30)
        curve = orders * (full * 5 + (math.ceil(math.log2(rest + 1)) if rest else 0)) / (2 * z * z)
        expected = rdp.rdp_privacy_accountant.compute_epsilon(orders, curve, delta)[0]
        got = accountant.epsilon(z, rounds, delta, "sequential", n, m, "rdp", "dp_ftrl")
        assert got == pytest.approx(expected, rel=1e-12)
        ledger = accountant.Ledger(z, delta, "sequential", n, m, "rdp", "dp_ftrl")
        assert ledger.epsilon_after(rounds) == got


def _authors_tree_epsilon(z: float, trees: int, steps_per_tree: int, delta: float) -> float:
    """The authors' own accounting of tree aggregation with restarts (Kairouz et al. 2021, App. D, as
    google-research/DP-FTRL's privacy.py computes it), recomputed here: a Gaussian of effective multiplier
    z / sqrt(ceil(log2 steps) * trees), RDP alpha / (2 sigma^2), converted to epsilon on alpha = 1.1 ... 199.9
    by eps = RDP - (log(delta (alpha - 1)) - alpha log(1 - 1/alpha)) / (alpha - 1)."""
    sigma = z / math.sqrt(math.ceil(math.log2(steps_per_tree)) * trees)
    alphas = np.arange(11, 2000) / 10
    return float(np.nanmin(alphas / 2 / sigma ** 2
                           - (np.log(delta * (alphas - 1)) - alphas * np.log(1 - 1 / alphas)) / (alphas - 1)))


@pytest.mark.parametrize("n,m,rounds,z", [(3000, 100, 90, 2.0), (342_477, 100, 1600, 2.0), (60_000, 500, 1200, 10.0)])
def test_dp_ftrl_epsilon_agrees_with_the_authors_accounting(n, m, rounds, z):
    """One participation per epoch (a tree per epoch): FMNIST-like (3 epochs of 30 rounds), the paper's
    StackOverflow setting (342,477 clients, 100 a round, 1,600 rounds: under one epoch) and its CIFAR-10
    command's shape (60,000 / 500 = 120 steps an epoch, 10 epochs, noise 10). Steps per tree are not powers
    of two here, where the authors' ceil(log2 L) equals the leaf-to-root count ceil(log2(L + 1)) distfl
    (and dp-accounting) use; the two conversions differ only in their grids of orders."""
    delta = 1 / n
    per_tree = min(n // m, rounds)
    got = accountant.epsilon(z, rounds, delta, "sequential", n, m, "rdp", "dp_ftrl")
    assert got == pytest.approx(_authors_tree_epsilon(z, rounds // per_tree, per_tree, delta), rel=1e-3)


def test_dp_ftrl_calibrates_to_a_target_epsilon():
    z = accountant.calibrate(8.0, 100, 1e-5, "sequential", 3000, 100, "rdp", "dp_ftrl")
    assert accountant.epsilon(z, 100, 1e-5, "sequential", 3000, 100, "rdp", "dp_ftrl") <= 8.0
    assert accountant.epsilon(z * (1 - 1e-3), 100, 1e-5, "sequential", 3000, 100, "rdp", "dp_ftrl") > 8.0


def test_dp_ftrl_run_is_the_same_on_one_and_two_ranks_and_resumed(tmp_path, small_config):
    """12 clients, 3 a round: a tree every 4 rounds; resumed after round 3, in the middle of the first."""
    private = [*FTRL, "train.clients_per_round=3", "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.3",
               "server.momentum=0.5", "train.rounds=7"]
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", *private)
    two = train_ok(small_config, f"output.dir={tmp_path / 'two'}", *private, nproc=2)
    train_ok(small_config, f"output.dir={tmp_path / 'resumed'}", *private[:-1], "train.rounds=3")
    resumed = train_ok(small_config, "train.rounds=7", resume=str(tmp_path / "resumed"))
    assert one["model_sha256"] == two["model_sha256"] == resumed["model_sha256"]
    assert one["privacy"] == two["privacy"] == resumed["privacy"]
    assert one["privacy"]["rounds_per_tree"] == 4 and one["privacy"]["mechanism"] == "dp_ftrl"
    eps = [r["privacy_epsilon"] for r in metrics(tmp_path / "one")]
    assert eps[-1] == pytest.approx(accountant.epsilon(0.8, 7, 1e-3, "sequential", 12, 3, "rdp", "dp_ftrl"))


# ---- banded matrix factorisation (Choquette-Choo et al. 2023) -----------------------------------------

def test_banded_noise_is_c_inverse_of_keyed_normals_with_the_factorisations_prefix_variance():
    n, b, numel, key = 24, 6, 100_000, secret.NoiseKey(False, 9)
    mf = banded.BandedFactorisation(n, b)
    c = mf.c
    assert len(c) == b and np.linalg.norm(c) == pytest.approx(1, rel=1e-12)
    w = [mf.round_noise(key, t, numel, torch.device("cpu")) for t in range(1, n + 1)]
    # C w = Z: the released noises are C^-1 applied to one keyed normal per round.
    for t in range(n):
        z = secret.keyed_normal([key.value, banded._MF_STREAM, t + 1], numel, torch.device("cpu"))
        cw = sum(c[i] * w[t - i] for i in range(min(b, t + 1)))
        assert float((cw - z).abs().max()) < 1e-9
    # The prefix noise of round j has variance ||(A C^-1)[j, :]||^2 = sum_{s<j} U_s^2.
    sums = np.cumsum(banded.inverse_column(c, n))
    prefix = torch.stack(w).cumsum(0)
    for j in (1, 2, 6, 12, 24):
        assert float(prefix[j - 1].var()) == pytest.approx(float(np.sum(sums[:j] ** 2)), rel=0.03)
    # The summed variance is the objective the factorisation minimised: below no correlation (b = 1:
    # ||A||_F^2 = n (n + 1) / 2) and no worse than its start, the banded square root of A.
    start = np.array([math.comb(2 * i, i) / 4.0 ** i for i in range(b)])
    assert banded.prefix_error(c, n) <= banded.prefix_error(start, n) < n * (n + 1) / 2


def test_banded_columns_b_apart_are_orthogonal_so_k_participations_cost_sqrt_k():
    """Thm. 2 of Choquette-Choo et al.: a client in rounds at least b apart moves C x by sqrt(k) at most;
    epsilon is one Gaussian of multiplier z / sqrt(k), k = ceil(rounds / floor(N / m))."""
    n, b = 30, 5
    c = banded.optimise(n, b)
    full = np.zeros((n, n))
    for s in range(n):
        for i in range(min(b, n - s)):
            full[s + i, s] = c[i]
    assert np.max(np.linalg.norm(full, axis=0)) == pytest.approx(1, rel=1e-12)
    for start in range(b):
        rounds = list(range(start, n, b))  # the most a client can join, b apart
        assert np.linalg.norm(full[:, rounds].sum(1)) <= math.sqrt(len(rounds)) * (1 + 1e-12)
    z, delta = 3.0, 1e-5
    for rounds, k in ((10, 1), (11, 2), (30, 3)):  # 50 clients, 5 a round: 10 rounds between participations
        expected = rdp.RdpAccountant()
        expected.compose(dp_accounting.GaussianDpEvent(z / math.sqrt(k)))
        assert accountant.epsilon(z, rounds, delta, "sequential", 50, 5, "rdp", "banded_mf") == \
            pytest.approx(expected.get_epsilon(delta), rel=1e-12)


def test_banded_noise_in_a_run_is_z_clip_over_m_times_c_inverse_of_the_keyed_normals(tmp_path, small_config):
    """In a real run whose clients contribute nothing (train.lr 1e-30 rounds every update to 0 in the
    fixed-point sum), server sgd at lr 1 without momentum moves the model by exactly the released noise:
    round t's move is (z C / m) w_t with C_band w = Z, Z the keyed normals of rounds 1..t (seed 3),
    recomputed here by a dense triangular solve of the banded Toeplitz matrix (Choquette-Choo et al. 2023,
    Sec. 3): the scale and the correlation over rounds the accountant's sensitivity assumes."""
    z, clip, m, rounds = 0.8, 0.3, 3, 5  # 12 clients, 3 a round: 4 bands
    train_ok(small_config, f"output.dir={tmp_path / 'run'}", *DP, "privacy.mechanism=banded_mf",
             "train.cohort=sequential", f"train.clients_per_round={m}", f"privacy.noise_multiplier={z}",
             f"privacy.clip_norm={clip}", "train.lr=1e-30", "server.momentum=0", f"train.rounds={rounds}",
             "checkpoint.every=1", "checkpoint.keep=10")
    params = [torch.load(tmp_path / "run" / "checkpoints" / checkpoint.checkpoint_name("round", t) / "state.pt",
                         weights_only=True)["params"].double() for t in range(1, rounds + 1)]
    c = banded.optimise(rounds, 4)
    band = np.zeros((rounds, rounds))
    for s in range(rounds):
        for i in range(min(4, rounds - s)):
            band[s + i, s] = c[i]
    normals = np.stack([secret.keyed_normal([3, banded._MF_STREAM, t], params[0].numel(), torch.device("cpu")).numpy()
                        for t in range(1, rounds + 1)])
    w = np.linalg.solve(band, normals)  # C^-1 Z, round by round
    for t in range(2, rounds + 1):
        moved = (params[t - 1] - params[t - 2]).numpy()
        assert np.abs(moved - z * clip / m * w[t - 1]).max() < 1e-6  # float32 parameters


def test_banded_run_is_the_same_on_one_and_two_ranks_and_resumed(tmp_path, small_config):
    private = [*DP, "privacy.mechanism=banded_mf", "train.cohort=sequential", "train.clients_per_round=3",
               "privacy.noise_multiplier=0.8", "privacy.clip_norm=0.3", "server.momentum=0.5", "train.rounds=7"]
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}", *private)
    two = train_ok(small_config, f"output.dir={tmp_path / 'two'}", *private, nproc=2)
    train_ok(small_config, f"output.dir={tmp_path / 'resumed'}", *private, "checkpoint.every=3")
    # Resume from round 3 of a 7-round run (its factorisation is of all 7 rounds).
    _resume_copy(tmp_path / "resumed", tmp_path / "again", checkpoint.checkpoint_name("round", 3))
    proc = run_cli(["train", "--resume", tmp_path / "again"])
    assert proc.returncode == 0, proc.stderr
    again = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert one["model_sha256"] == two["model_sha256"] == again["model_sha256"]
    assert one["privacy"]["bands"] == 4 and one["privacy"]["mechanism"] == "banded_mf"


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


def _poisson_epsilon(z: float, q: float, rounds: int, delta: float) -> float:
    """A fresh dp-accounting RDP accountant, `rounds` Poisson-sampled Gaussian rounds."""
    acc = rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    acc.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), rounds))
    return acc.get_epsilon(delta)


def _stop_at_round_5(monkeypatch):
    run_round = runner.Trainer.run_round

    def stopping(self, t):
        if t == 5:
            self.request_stop()  # as SIGTERM would: checkpointed after round 5, then stopped
        return run_round(self, t)

    monkeypatch.setattr(runner.Trainer, "run_round", stopping)


def _fail_in_round_6s_evaluation(monkeypatch):
    evaluate_round = runner.Trainer.evaluate_round

    def failing(self, clients):
        if self.state.last_round == 6:
            raise RuntimeError("an evaluation that fails")
        return evaluate_round(self, clients)

    monkeypatch.setattr(runner.Trainer, "evaluate_round", failing)


@pytest.mark.parametrize("ending,status,rounds", [("diverged", "diverged", 5), ("stopped", "stopped", 5),
                                                  ("failed", "failed", 6)])
def test_an_unfinished_run_accounts_the_rounds_of_its_model_not_its_last_evaluation(
        tmp_path, small_config, dp_plugins, monkeypatch, ending, status, rounds):
    """8 rounds evaluated every 3: a run that diverges in round 5's server step, stops after round 5, or
    fails in round 6's evaluation (after its server step) holds a model with 5, 5 and 6 rounds of noised
    sums; summary.json accounts those rounds (its last evaluation was round 3), as a fresh accountant does."""
    run = tmp_path / "run"
    args = ["train", str(small_config), f"output.dir={run}", *DP, "train.cohort=poisson", "privacy.noise_multiplier=1.1",
            "train.rounds=8", "eval.every=3", "checkpoint.every=4"]
    if ending == "diverged":
        args.append("algorithm.name=dpplugins:DivergesAtRound5")
    elif ending == "stopped":
        _stop_at_round_5(monkeypatch)
    else:
        _fail_in_round_6s_evaluation(monkeypatch)
    proc = run_cli(args)
    assert proc.returncode != 0
    s = json.loads((run / "summary.json").read_text())
    assert s["status"] == status and s["privacy"]["rounds"] == rounds
    assert s["privacy"]["epsilon"] == _poisson_epsilon(1.1, 5 / 12, rounds, 1e-3)
    assert s["privacy"]["epsilon"] > _poisson_epsilon(1.1, 5 / 12, 3, 1e-3)  # the last evaluation's rounds
    for row in metrics(run):  # each round's row: the rounds up to it
        assert row["privacy_epsilon"] == _poisson_epsilon(1.1, 5 / 12, row["round"], 1e-3)


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
    (["eval.train_metrics=true"], "eval.train_metrics releases global_train_loss"),
    (["train.cohort=sequential"], "no sampling accountant"),
    (["privacy.mechanism=dp_ftrl"], "accounted for train.cohort=sequential"),
    (["privacy.mechanism=dp_ftrl", "train.cohort=sequential", "privacy.accountant=pld"], "rdp accountant only"),
    (["privacy.mechanism=dp_ftrl", "train.cohort=sequential", "privacy.adaptive_clip=true",
      "privacy.count_noise_multiplier=5"], "adaptive_clip is built for"),
    (["privacy.mechanism=banded_mf", "train.cohort=sequential", "privacy.bands=3"], "exceeds the 2 rounds"),
    (["train.cohort=random", "privacy.accountant=pld"], "Poisson sampling only"),
    (["algorithm.weighting=samples"], "sample counts"),
    (["data.normalize=mean_std"], "mean and std of every client's training inputs"),
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


def test_dp_wraps_the_method_with_the_fixed_denominator(method_fixture):
    """Under privacy.mechanism=gaussian every client's weight is 1 / train.clients_per_round, whoever else
    was sampled (DP-FedAvg's fixed denominator), while the method inside keeps its own weighting."""
    f = method_fixture("privacy.mechanism=gaussian", "privacy.noise_multiplier=1.0", "privacy.clip_norm=1.0",
                       "privacy.delta=1e-3", "algorithm.weighting=uniform", "train.clients_per_round=3")
    assert f.method.client_weight(0, [0, 1]) == 1.0 / 3.0
    assert f.method.unwrapped().client_weight(0, [0, 1]) == 0.5

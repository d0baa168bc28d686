"""Client packs (runtime.pack_size > 1): a pack trains each client as one-at-a-time training does (to
float rounding), for every algorithm and aggregation option; the result does not depend on the world
size or on a stop and resume; what cannot be packed is refused before any work."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from conftest import build_trainer, one_and_two, run_cli, summary, train_ok, write_config
from distfl.errors import ConfigError

# Packed and one-at-a-time runs differ only by the summation order of vectorised kernels.
TOLERANCE = dict(rtol=1e-4, atol=1e-5)
# A CNN on 16x16 inputs: its vectorised convolutions round differently from the per-client ones, so
# pack_size=4 gives other bits than pack_size=1 (which makes bit-identity across ranks a real check).
CNN = {"model": {"name": "simplecnn"}, "data": {"synthetic_image_size": 16},
       "train": {"rounds": 4, "clients_per_round": 10, "lr": 0.05, "batch_size": 16}}


def _trained(config, tmp_path, name, *overrides, rounds=2):
    """In-process Trainer after `rounds` rounds, and how many packs (of 2+ clients) it trained."""
    from distfl.federation import pack

    packs = []
    train_rows = pack.train_pack_rows

    def counting(flat, step, data, indices, runs, *args):
        packs.append(len(runs))
        return train_rows(flat, step, data, indices, runs, *args)

    trainer = build_trainer(config, tmp_path / name, *overrides)
    original, pack.train_pack_rows = pack.train_pack_rows, counting
    try:
        for t in range(1, rounds + 1):
            trainer.run_round(t)
    finally:
        pack.train_pack_rows = original
    return trainer, packs


PACKABLE = {
    "fedavg": ["train.momentum=0.9", "train.weight_decay=0.01"],
    "fedavg_adam": ["server.optimizer=adam", "server.lr=0.01"],
    "fedprox": ["algorithm.name=fedprox", "algorithm.mu=0.5"],
    "scaffold": ["algorithm.name=scaffold", "runtime.client_state=disk"],
    "scaffold_weights": ["algorithm.name=scaffold", "algorithm.scaffold_correction=weights", "train.momentum=0.9",
                         "train.weight_decay=0.01", "runtime.client_state=disk"],
    "feddyn": ["algorithm.name=feddyn", "algorithm.alpha=0.1", "runtime.client_state=disk"],
    "fednova": ["algorithm.name=fednova", "train.momentum=0.5"],
    "fedadc": ["algorithm.name=fedadc", "algorithm.beta_local=0.5", "algorithm.beta_global=0.9"],
    "fedadc_heavy_ball": ["algorithm.name=fedadc", "algorithm.variant=heavy_ball", "algorithm.beta_global=0.9"],
    "slowmo": ["algorithm.name=slowmo", "algorithm.beta_global=0.9"],
    "fedfor": ["algorithm.name=fedfor", "algorithm.fedfor_alpha=0.5"],
    "gma": ["aggregation.mask=gma", "aggregation.tau=0.4"],
    # SphereFed's fixed head and MSE loss (its one-hot targets once used an in-place scatter vmap refuses)
    "sphere_head_mse": ["model.head=sphere", "train.momentum=0.9"],
}


@pytest.mark.parametrize("name", list(PACKABLE))
def test_packed_equals_one_at_a_time(tmp_path, name):
    """Three rounds (the hooks of SCAFFOLD, FedDyn, FedADC and FedFOR act from round 2 on), Dirichlet
    clients of unequal sizes, 6 a round: packs of 4 and 2 give the model one-at-a-time training gives."""
    config = write_config(tmp_path / "c.yaml", train={"rounds": 3, "clients_per_round": 6, "lr": 0.1,
                                                       "batch_size": 16})
    one, packs_one = _trained(config, tmp_path, "one", "runtime.pack_size=1", *PACKABLE[name], rounds=3)
    four, packs_four = _trained(config, tmp_path, "four", "runtime.pack_size=4", *PACKABLE[name], rounds=3)
    assert packs_one == [] and packs_four == [4, 2] * 3
    start = _trained(config, tmp_path, "start", *PACKABLE[name], rounds=0)[0].global_params
    assert (one.global_params - start).abs().max() > 1e-2  # the rounds moved the model
    torch.testing.assert_close(four.global_params, one.global_params, **TOLERANCE)
    for key, value in one.algorithm.server_state().items():
        if isinstance(value, torch.Tensor):
            torch.testing.assert_close(four.algorithm.server_state()[key], value, **TOLERANCE)


@pytest.mark.parametrize("fedbn", [False, True], ids=["batchnorm", "fedbn"])
def test_packed_batchnorm_model_equals_one_at_a_time(tmp_path, monkeypatch, fedbn):
    """ResNet-20: running statistics per client in the pack; FedBN keeps each client's own BatchNorm.

    Its ReLUs are made smooth (softplus) here. BatchNorm centres activations on 0, and with ReLU a
    1e-7 rounding difference of the vectorised kernels flips the odd unit whose input is within 1e-7
    of 0, which moves that step's gradient by ~1e-3 in a few coordinates (measured: 5e-3 with ReLU,
    5e-7 with softplus, same step); over rounds that grows to a few percent of the update. Either
    result is as right as the other; without the kink the comparison is a tight one."""
    monkeypatch.setattr(torch.nn.ReLU, "forward", lambda self, x: torch.nn.functional.softplus(x))
    config = write_config(tmp_path / "c.yaml", model={"name": "resnet20"},
                          data={"synthetic_channels": 3, "synthetic_image_size": 8, "synthetic_train": 600},
                          partition={"scheme": "dirichlet", "num_clients": 6, "alpha": 0.5},
                          train={"rounds": 2, "clients_per_round": 4, "lr": 0.05, "batch_size": 32})
    extra = ["aggregation.fedbn=true", "runtime.client_state=disk"] if fedbn else []
    one, _ = _trained(config, tmp_path, "one", "runtime.pack_size=1", *extra, rounds=2)
    four, packs = _trained(config, tmp_path, "four", "runtime.pack_size=4", *extra, rounds=2)
    assert packs == [4, 4]
    torch.testing.assert_close(four.global_params, one.global_params, **TOLERANCE)
    torch.testing.assert_close(four.global_buffers, one.global_buffers, **TOLERANCE)
    if fedbn:
        states = [(one.store.get(c, dict), four.store.get(c, dict)) for c in range(6)]
        assert sum(1 for a, _ in states if a) >= 4  # clients that trained hold their own BatchNorm
        for a, b in states:
            assert a.keys() == b.keys()
            for key in a:
                torch.testing.assert_close(b[key], a[key], **TOLERANCE)


def test_unequal_clients_take_exactly_their_own_steps(monkeypatch):
    """Clients of 7, 21 and 42 samples (1, 2 and 5 batches of 10 an epoch, partial ones; the 21st sample
    joins the batch before it, as a one-sample batch under BatchNorm does), two epochs, momentum, weight
    decay, crop-and-flip augmentation: each client of the pack ends with the model, BatchNorm statistics
    and loss sum of its own `train_client`.

    ReLU is made smooth as in the test above: with ReLU the comparison held with 2 intra-op threads and
    failed with 1 on an AVX-512 Xeon (8e-4 apart after 8 steps, old code and new), one flipped unit at 0."""
    monkeypatch.setattr(torch.nn.ReLU, "forward", lambda self, x: torch.nn.functional.softplus(x))
    from distfl.data.datasets import random_crop_flip
    from distfl.federation.local import ClientRun, FlatModel, LocalSGD, local_steps, train_client
    from distfl.federation.pack import PackStep
    from distfl.models import build_model
    from distfl.config.schema import ModelConfig, TrainConfig

    torch.manual_seed(0)
    flat = FlatModel(build_model(ModelConfig(name="resnet20"), (3, 8, 8), 4))
    data = SimpleNamespace(train_x=torch.randn(70, 3, 8, 8), train_y=torch.randint(0, 4, (70,)),
                           augment=random_crop_flip)
    indices = [torch.arange(0, 7), torch.arange(7, 28), torch.arange(28, 70)]
    train_cfg = TrainConfig(lr=0.05, weight_decay=0.01, momentum=0.9, batch_size=10, local_epochs=2)
    algorithm = SimpleNamespace(seed=5, begin_client=lambda run, worker: None,
                                before_forward=lambda w, run: None, correct_gradient=lambda w, g, run: None,
                                local_loss=lambda model, x, y, run: model.loss(model(x), y),
                                local_training=lambda run, worker: run.train())
    start_p, start_b = flat.params.clone(), flat.buffers.clone()

    def runs():
        return [ClientRun(client_id=c, round_idx=2, num_samples=len(i), weight=1.0,
                          steps=local_steps(len(i), 10, 2, fold_single=flat.fold_single), global_params=start_p,
                          sgd=LocalSGD(flat, data, i, train_cfg, algorithm))
                for c, i in enumerate(indices)]

    packed = []
    for run in train_client(flat, data, indices, runs(), train_cfg, algorithm, start_b, PackStep(flat)):
        packed.append((flat.params.clone(), flat.buffers.clone(), run.loss_sum))
    assert flat.fold_single and [r.steps for r in runs()] == [2, 4, 10]
    for run, idx, (params, buffers, loss_sum) in zip(runs(), indices, packed):
        list(train_client(flat, data, [idx], [run], train_cfg, algorithm, start_b))
        assert (flat.params - start_p).abs().max() > 1e-3
        torch.testing.assert_close(params, flat.params, **TOLERANCE)
        torch.testing.assert_close(buffers, flat.buffers, **TOLERANCE)
        torch.testing.assert_close(loss_sum, run.loss_sum, rtol=1e-5, atol=0)


def test_packs_do_not_depend_on_the_world_size():
    """The cohort is cut into the same packs, in cohort order, for any world size; whole packs are dealt."""
    from distfl.federation.population import place_packs

    sizes = np.random.default_rng(0).integers(1, 100, size=40)
    cohort = sorted(np.random.default_rng(1).choice(40, size=11, replace=False).tolist())
    expected = [cohort[0:4], cohort[4:8], cohort[8:11]]
    for world in (1, 2, 3, 5):
        ranks = place_packs(cohort, sizes, world, 4)
        assert len(ranks) == world
        assert sorted(p for r in ranks for p in r) == expected
    assert place_packs(cohort, sizes, 1, 4) == [expected]


def test_pack_size_4_one_rank_equals_two_ranks(tmp_path):
    """Bit-identical final model on 1 and 2 gloo processes at pack_size=4 (three packs: 4, 4, 2; 2
    ranks get 2 and 1 packs); and pack_size=4 is a different computation from pack_size=1 on this CNN,
    so the agreement is not one-at-a-time training in disguise. (SCAFFOLD on 2 ranks: the resume test.)"""
    config = write_config(tmp_path / "c.yaml", **CNN)
    one, two = one_and_two(config, tmp_path, "runtime.pack_size=4")
    single = train_ok(config, f"output.dir={tmp_path / 'single'}", "runtime.pack_size=1")
    assert two["world_size"] == 2
    assert one["model_sha256"] == two["model_sha256"]
    assert single["model_sha256"] != one["model_sha256"]


def test_pack_resume_equals_uninterrupted(tmp_path):
    """SCAFFOLD at pack_size=4, stopped after round 2 and resumed to round 4 on 2 ranks: same model."""
    config = write_config(tmp_path / "c.yaml", **CNN)
    args = ["algorithm.name=scaffold", "runtime.client_state=disk", "runtime.pack_size=4"]
    through = train_ok(config, f"output.dir={tmp_path / 'through'}", *args)
    train_ok(config, f"output.dir={tmp_path / 'stopped'}", *args, "train.rounds=2")
    resumed = train_ok(None, "train.rounds=4", resume=str(tmp_path / "stopped"), nproc=2)
    assert resumed["model_sha256"] == through["model_sha256"]


@pytest.mark.parametrize("overrides,expected", [
    (["algorithm.name=scaffold"], "runtime.client_state=disk"),
    (["aggregation.fedbn=true", "model.name=resnet20", "data.synthetic_channels=3"], "runtime.client_state=disk"),
    (["runtime.placement=sticky"], "runtime.pack_size=1"),
    (["algorithm.name=fedadc", "algorithm.kd_lambda=0.5"], "algorithm.name=fedadc cannot train clients in packs"),
    (["runtime.pack_size=-1"], "runtime.pack_size must be >= 0"),
])
def test_unpackable_configs_are_refused_before_any_work(tmp_path, small_config, overrides, expected):
    out = tmp_path / "run"
    proc = run_cli(["train", small_config, f"output.dir={out}", "runtime.pack_size=4", *overrides])
    assert proc.returncode != 0
    assert expected in proc.stderr + proc.stdout
    assert not out.exists()


def test_a_plugin_method_with_its_own_loss_is_refused():
    """A method that overrides local_loss (which a pack does not call) names itself and pack_size=1."""
    from distfl.algorithms.base import Algorithm
    from distfl.federation.pack import check_packable

    class Distilling(Algorithm):
        def local_loss(self, model, x, y, run):
            return model.loss(model(x), y) * 2

    cfg = SimpleNamespace(algorithm=SimpleNamespace(name="my_method"))
    method = Distilling.__new__(Distilling)
    with pytest.raises(ConfigError, match="algorithm.name=my_method .*local_loss.*runtime.pack_size=1"):
        check_packable(cfg, method, 4, sticky=False)
    check_packable(cfg, method, 1, sticky=False)  # one at a time: fine


def test_auto_pack_size_packs_on_cuda_only_where_the_run_can_pack():
    """Auto (0): one at a time on CPU; packs of 50 on CUDA, except where an explicit size would be
    refused (sticky placement, a method that cannot pack): there auto trains one at a time, no error."""
    from distfl.algorithms.base import Algorithm
    from distfl.federation.pack import resolve_pack_size

    class Distilling(Algorithm):
        def local_loss(self, model, x, y, run):
            return model.loss(model(x), y) * 2

    plain, distilling = Algorithm.__new__(Algorithm), Distilling.__new__(Distilling)
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_pack_size(0, cpu, plain, sticky=False) == 1
    assert resolve_pack_size(0, cuda, plain, sticky=False) == 50
    assert resolve_pack_size(0, cuda, plain, sticky=True) == 1
    assert resolve_pack_size(0, cuda, distilling, sticky=False) == 1
    assert resolve_pack_size(8, cpu, plain, sticky=False) == 8
    assert resolve_pack_size(8, cuda, distilling, sticky=True) == 8  # explicit: check_packable refuses it


def test_summary_and_start_line_name_the_pack_size(tmp_path, small_config):
    proc = run_cli(["train", small_config, f"output.dir={tmp_path / 'p'}", "runtime.pack_size=4"])
    assert proc.returncode == 0, proc.stderr
    assert "clients in packs of 4" in proc.stdout + proc.stderr
    assert summary(tmp_path / "p")["pack_size"] == 4
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}")
    assert one["pack_size"] == 1


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedavg_adam"])
def test_a_packs_statistics_added_at_once_equal_client_by_client(tmp_path, monkeypatch, name):
    """Methods with the default statistics add a pack's updates as rows (StatBuffer.add_rows): the
    round's sums, hence the model, are those of adding each client's in turn, bit for bit."""
    from distfl.federation import round as round_engine
    config = write_config(tmp_path / "c.yaml", train={"rounds": 3, "clients_per_round": 6, "lr": 0.1,
                                                       "batch_size": 16})
    at_once, _ = _trained(config, tmp_path, "rows", "runtime.pack_size=4", *PACKABLE[name], rounds=3)
    calls = []
    monkeypatch.setattr(round_engine, "pack_statistics", lambda algorithm: calls.append(1) and False)
    one_by_one, _ = _trained(config, tmp_path, "each", "runtime.pack_size=4", *PACKABLE[name], rounds=3)
    assert calls  # the client-by-client path ran
    assert torch.equal(at_once.global_params, one_by_one.global_params)


def test_add_rows_equals_add_row_by_row():
    from distfl.federation.aggregate import Segment, StatBuffer
    gen = torch.Generator().manual_seed(1)
    rows = torch.randn(7, 1000, generator=gen) * 1e-2
    rows[3, 10] = float("inf")  # a non-finite client is counted
    weights = [0.1, 0.3, 0.05, 0.2, 0.15, 0.1, 0.1]
    segments = [Segment("delta", 1000), Segment("wide", 1000, accumulate="int64"), Segment("count", 1000, kind="int"),
                Segment("loss", 1)]
    a, b = StatBuffer(segments, torch.device("cpu"), 7), StatBuffer(segments, torch.device("cpu"), 7)
    a._scratch = a._scratch[:300]  # rows go in chunks
    a.add_rows("delta", rows, weights)
    a.add_rows("wide", rows, weights)
    a.add_rows("count", (rows * 100).round(), [2] * 7)
    a.add_rows("loss", rows[:, 0], [1.0] * 7)
    for k, w in enumerate(weights):
        b.add("delta", rows[k], w)
        b.add("wide", rows[k], w)
        b.add("count", (rows[k] * 100).round(), 2)
        b.add("loss", rows[k, 0], 1.0)
    assert torch.equal(a.buffer, b.buffer)
    assert int(a.view("_nonfinite")[0]) == 1

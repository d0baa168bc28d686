"""A model that freezes parameters (`requires_grad=False`) trains only the rest (docs/extending.md): the
frozen ones are neither in the flat vector, nor summed, nor sent, nor moved by a step or weight decay, one
client at a time, in packs and across ranks, and they are kept in the checkpoint and the model's hash."""
from __future__ import annotations

import sys

import pytest
import torch

from conftest import assert_packs_train_as_one_at_a_time, build_trainer, one_two_resumed, train_ok, write_config

# A plugin model with a frozen backbone: 23 parameter tensors, of which the adapter's and the head's 8 train.
FROZEN_MODEL = '''
from torch import nn

WIDTH = 16


def build(input_shape, num_classes):
    c, h, w = input_shape
    backbone = [nn.Flatten(), nn.Linear(c * h * w, WIDTH)]
    for _ in range(3):
        backbone += [nn.LayerNorm(WIDTH), nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    backbone.append(nn.Linear(WIDTH, WIDTH, bias=False))
    for layer in backbone:
        layer.requires_grad_(False)
    adapter = [nn.Linear(WIDTH, WIDTH), nn.LayerNorm(WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    return nn.Sequential(*backbone, *adapter, nn.Linear(WIDTH, num_classes))
'''

WEIGHT_DECAY = ("algorithm.name=fedprox", "algorithm.options.mu=0.5", "train.weight_decay=0.01", "train.momentum=0.9")


@pytest.fixture(scope="module")
def frozen_lab(tmp_path_factory):
    """The package `frozenlab` (the model above), on sys.path for this module's in-process runs."""
    root = tmp_path_factory.mktemp("frozenlab")
    (root / "frozenlab").mkdir()
    (root / "frozenlab" / "__init__.py").write_text("")
    (root / "frozenlab" / "models.py").write_text(FROZEN_MODEL)
    sys.path.insert(0, str(root))
    yield root
    sys.path.remove(str(root))
    for name in [m for m in sys.modules if m == "frozenlab" or m.startswith("frozenlab.")]:
        del sys.modules[name]


@pytest.fixture
def config(tmp_path, frozen_lab):
    return write_config(tmp_path / "frozen.yaml", model={"name": "frozenlab.models:build"})


def frozen_of(trainer) -> dict[str, torch.Tensor]:
    """The frozen parameters of the trainer's global model (loaded into its worker)."""
    trainer.worker.load(trainer.global_params, trainer.global_buffers)
    return {name: p.detach().clone() for name, p in trainer.worker.module.named_parameters() if not p.requires_grad}


def test_only_the_trainable_parameters_are_flat_summed_and_sent(tmp_path, config):
    trainer = build_trainer(config, tmp_path / "run", "system.bandwidth=uniform:50,500")
    try:
        named = dict(trainer.worker.module.named_parameters())
        trainable = {name: p for name, p in named.items() if p.requires_grad}
        assert len(named) == 23 and len(trainable) == 8
        count = sum(p.numel() for p in trainable.values())
        assert list(trainer.worker.param_slices) == list(trainable)
        assert trainer.worker.num_params == trainer.global_params.numel() == count
        sizes = {s.name: s.numel for s in trainer.algorithm.segments()}
        assert sizes == {"delta": count, "buffers": 0}
        assert trainer.payload_bytes() == (4 * count, 4 * count)  # the float32 bytes each way (down, up)
        assert trainer.system.model.download_kbit == trainer.system.model.upload_kbit == 4 * count * 8 / 1024
        assert len(trainer.worker.frozen) == 15  # kept as the model's fixed data (checkpointed, checked across ranks)
    finally:
        trainer.close()


@pytest.mark.parametrize("overrides", [(), WEIGHT_DECAY], ids=["fedavg", "fedprox_weight_decay_momentum"])
def test_frozen_parameters_are_bit_identical_after_training_and_kept_in_the_checkpoint(tmp_path, config, overrides):
    from distfl.checkpoint import complete_checkpoints, load

    initial = build_trainer(config, tmp_path / "initial", *overrides)
    before, start = frozen_of(initial), initial.global_params.clone()
    initial.close()
    result = train_ok(config, f"output.dir={tmp_path / 'run'}", *overrides)
    trained = build_trainer(config, tmp_path / "resumed", *overrides)
    try:
        state = load(complete_checkpoints(tmp_path / "run")[-1], "cpu")
        trained.model.load_state_dict(state)
        assert not torch.equal(trained.model.params, start)  # the 8 trained
        assert [torch.equal(saved, value) for saved, value in zip(state["frozen"], before.values(), strict=True)] \
            == [True] * 15
        trained.worker.load(trained.model.params, trained.model.buffers)
        assert trained.worker.state_sha256() == result["model_sha256"]  # the model's hash covers the frozen ones
    finally:
        trained.close()


@pytest.mark.parametrize("overrides", [(), WEIGHT_DECAY], ids=["fedavg", "fedprox_weight_decay_momentum"])
def test_packs_leave_frozen_parameters_and_equal_one_at_a_time(tmp_path, config, overrides):
    assert_packs_train_as_one_at_a_time(config, tmp_path, 3, *overrides)
    trainer = build_trainer(config, tmp_path / "pack", "runtime.pack_size=3", *overrides)
    try:
        before = frozen_of(trainer)
        trainer.run_round(1)
        assert all(torch.equal(value, before[name]) for name, value in frozen_of(trainer).items())
    finally:
        trainer.close()


def test_graphed_packs_leave_frozen_parameters(tmp_path, config, monkeypatch):
    """The CPU stand-in of a CUDA graph (test_cuda_graphs.py) replays the pack step of the frozen model."""
    from distfl.federation import graphs
    from test_cuda_graphs import ReplayOnCpu

    backend = ReplayOnCpu()
    monkeypatch.setattr(graphs, "backend_for", lambda device: backend)
    trained = {}
    for mode in ("off", "on"):
        trainer = build_trainer(config, tmp_path / mode, "runtime.pack_size=3", f"runtime.cuda_graphs={mode}")
        try:
            before = frozen_of(trainer)
            trainer.run_round(1)
            assert all(torch.equal(value, before[name]) for name, value in frozen_of(trainer).items())
            trained[mode] = trainer.global_params.clone()
        finally:
            trainer.close()
    assert backend.captured >= 1
    assert torch.equal(trained["on"], trained["off"])


@pytest.mark.parametrize("overrides,copies", [
    (["algorithm.name=fedntd"], ["global_model"]),
    (["algorithm.name=moon", "model.projection_dim=256"], ["global_model", "previous_model"]),
    (["algorithm.name=fedadc", "algorithm.kd_lambda=0.35"], ["teacher"]),
], ids=["fedntd", "moon", "fedadc"])
def test_method_copies_of_the_model_hold_the_workers_frozen_weights(tmp_path, config, overrides, copies):
    """Methods that build more models of the run's architecture (a teacher, MOON's global and previous
    models): their frozen backbone is the worker's, not a fresh draw."""
    trainer = build_trainer(config, tmp_path / "run", *overrides)
    try:
        for name in copies:
            copy = getattr(trainer.algorithm, name)
            assert [torch.equal(a, b) for a, b in zip(copy.frozen, trainer.worker.frozen, strict=True)] == [True] * 15
    finally:
        trainer.close()


def test_one_rank_equals_two_ranks_and_resumed(tmp_path, config, frozen_lab):
    one_two_resumed(config, tmp_path, *WEIGHT_DECAY, paths=(frozen_lab,))


def test_a_run_of_a_model_with_frozen_parameters_starts_another_by_model_init_from(tmp_path, config):
    """model.init_from reads a finished run's frozen parameters by name, beside its trained ones."""
    from distfl.checkpoint import complete_checkpoints
    from distfl.federation.init_from import read

    first = train_ok(config, f"output.dir={tmp_path / 'first'}", "train.rounds=2")
    second = build_trainer(config, tmp_path / "second", f"model.init_from={tmp_path / 'first'}", "seed=9")
    try:
        state, _, _ = read(str(tmp_path / "first"), second.worker.module, {})
        frozen = frozen_of(second)
        assert set(frozen) <= set(state) and all(torch.equal(frozen[k], state[k]) for k in frozen)
        assert second.worker.state_sha256() == first["model_sha256"]
        assert complete_checkpoints(tmp_path / "first")
    finally:
        second.close()

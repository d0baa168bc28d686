"""model.init_from: a run starts from saved weights (a finished run directory, a torch state dict, a
safetensors file) exactly as a run whose seeded initialisation were those weights; a file that does not
fit the model is refused in one line before any work; its SHA-256 is recorded and checked on resume."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from conftest import REPO, assert_packs_train_as_one_at_a_time, assert_refused, build_trainer, metrics, one_two_resumed, run_cli, summary, train_ok, write_config


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def config(tmp_path: Path, **sections) -> Path:
    return write_config(tmp_path / "run.yaml", **{"train": {"rounds": 4, "clients_per_round": 4, "lr": 0.1,
                                                            "batch_size": 16}, "eval": {"every": 1}, **sections})


def initial_state(config_path: Path, tmp_path: Path, *overrides: str) -> dict:
    """The model a run of `config_path` starts from (its seeded initialisation), as a state dict."""
    trainer = build_trainer(config_path, tmp_path / "initial", *overrides)
    try:
        return {name: tensor.clone() for name, tensor in trainer.worker.module.state_dict().items()}
    finally:
        trainer.close()


def perturbed(state: dict) -> dict:
    """Other weights of the same shapes: the run that starts from them trains another model."""
    return {name: tensor + 0.01 if tensor.is_floating_point() else tensor for name, tensor in state.items()}


def test_a_state_dict_start_equals_the_seeded_run_whose_init_it_is(tmp_path):
    """Seed 3's initial model, saved as a state dict and as safetensors and given to a run of seed 3, trains
    the seeded run's model bit for bit; other weights train another one."""
    cfg = config(tmp_path)
    state = initial_state(cfg, tmp_path)
    torch.save(state, tmp_path / "init.pt")
    save_file(state, tmp_path / "init.safetensors")
    torch.save(perturbed(state), tmp_path / "other.pt")
    seeded = train_ok(cfg, f"output.dir={tmp_path / 'seeded'}")
    from_pt = train_ok(cfg, f"output.dir={tmp_path / 'pt'}", f"model.init_from={tmp_path / 'init.pt'}")
    from_st = train_ok(cfg, f"output.dir={tmp_path / 'st'}", f"model.init_from={tmp_path / 'init.safetensors'}")
    other = train_ok(cfg, f"output.dir={tmp_path / 'other'}", f"model.init_from={tmp_path / 'other.pt'}")
    assert from_pt["model_sha256"] == from_st["model_sha256"] == seeded["model_sha256"] != other["model_sha256"]
    assert [r["train_loss"] for r in metrics(tmp_path / "pt")] == [r["train_loss"] for r in metrics(tmp_path / "seeded")]
    # The bytes read are recorded; the default run records none.
    assert from_pt["data_files"]["model.init_from"] == {"path": str(tmp_path / "init.pt"), "sha256": sha(tmp_path / "init.pt")}
    assert from_st["data_files"]["model.init_from"]["sha256"] == sha(tmp_path / "init.safetensors")
    assert "model.init_from" not in seeded["data_files"]


def test_a_run_directory_gives_its_final_model_buffers_included(tmp_path):
    """A ResNet-20 (BatchNorm) run's final model, read from its directory, is the model the second run
    starts from: the same hash (parameters and running statistics) and the same evaluation."""
    cfg = config(tmp_path, model={"name": "resnet20"}, partition={"scheme": "iid", "num_clients": 6},
                 train={"rounds": 2, "clients_per_round": 3, "lr": 0.05, "batch_size": 16})
    first = train_ok(cfg, f"output.dir={tmp_path / 'pretrain'}")
    trainer = build_trainer(cfg, tmp_path / "second", f"model.init_from={tmp_path / 'pretrain'}", "seed=9",
                            "partition.seed=3")  # another init seed, the same data
    try:
        assert trainer.worker.state_sha256() == first["model_sha256"]
        assert trainer.evaluate() == (first["final_test_acc"], first["final_test_loss"])
        read = tmp_path / "pretrain" / "checkpoints" / "round_000002" / "state.pt"
        assert dict(trainer.data_sources.items())["model.init_from"] == {"path": str(read), "sha256": sha(read)}
    finally:
        trainer.close()


def test_a_run_directory_of_an_earlier_release_gives_its_final_model(tmp_path):
    """Its checkpoints do not name the model's tensors: the model built from the same model.* keys does."""
    release = REPO / "tests" / "fixtures" / "checkpoint_0.1.0_scaffold_gma"
    trainer = build_trainer(release / "config.yaml", tmp_path / "second", f"model.init_from={release}", "seed=9")
    try:
        assert trainer.worker.state_sha256() == summary(release)["model_sha256"]
    finally:
        trainer.close()
    other = write_config(tmp_path / "other.yaml", model={"name": "mlp", "mlp_hidden": 32})
    assert_refused(other, tmp_path / "out", [f"model.init_from={release}"],
                   f"model.init_from: {release / 'checkpoints' / 'round_000001' / 'state.pt'} was written by an "
                   "earlier distfl")


def test_a_loaded_start_is_the_same_on_one_and_two_ranks_and_resumed(tmp_path):
    cfg = config(tmp_path, train={"rounds": 6, "clients_per_round": 5, "lr": 0.1, "batch_size": 16})
    torch.save(perturbed(initial_state(cfg, tmp_path)), tmp_path / "init.pt")
    one, _, _ = one_two_resumed(cfg, tmp_path, f"model.init_from={tmp_path / 'init.pt'}")
    assert one["model_sha256"] != train_ok(cfg, f"output.dir={tmp_path / 'seeded'}")["model_sha256"]


def test_a_loaded_start_trains_in_packs_as_one_client_at_a_time(tmp_path):
    cfg = config(tmp_path)
    torch.save(perturbed(initial_state(cfg, tmp_path)), tmp_path / "init.pt")
    assert_packs_train_as_one_at_a_time(cfg, tmp_path, 4, f"model.init_from={tmp_path / 'init.pt'}")


@pytest.mark.parametrize("method", ["ditto", "fedper"])
def test_a_personalised_method_starts_its_clients_from_the_loaded_model(tmp_path, method):
    """Each client's own state starts from the loaded model as from the seeded one: the seeded init given
    as a file gives the same global model and the same per-client accuracies."""
    cfg = config(tmp_path, algorithm={"name": method}, eval={"every": 2, "clients": True},
                 train={"rounds": 2, "clients_per_round": 4, "lr": 0.1, "batch_size": 16})
    torch.save(initial_state(cfg, tmp_path), tmp_path / "init.pt")
    seeded = train_ok(cfg, f"output.dir={tmp_path / 'seeded'}")
    loaded = train_ok(cfg, f"output.dir={tmp_path / 'loaded'}", f"model.init_from={tmp_path / 'init.pt'}")
    assert loaded["model_sha256"] == seeded["model_sha256"]
    assert loaded["final_client_acc"] == seeded["final_client_acc"]


@pytest.mark.parametrize("method", ["ditto", "apfl", "local"])
def test_a_clients_own_model_starts_as_the_loaded_model(tmp_path, method):
    cfg = config(tmp_path, algorithm={"name": method})
    weights = perturbed(initial_state(cfg, tmp_path))
    torch.save(weights, tmp_path / "init.pt")
    trainer = build_trainer(cfg, tmp_path / "run", f"model.init_from={tmp_path / 'init.pt'}")
    try:
        loaded = torch.cat([weights[name].reshape(-1) for name, _ in trainer.worker.module.named_parameters()])
        assert torch.equal(trainer.global_params, loaded)
        assert torch.equal(trainer.algorithm.init_client_state()["v"], loaded)
    finally:
        trainer.close()


def test_weights_that_do_not_fit_are_refused_in_one_line_before_any_work(tmp_path):
    cfg = config(tmp_path)
    state = initial_state(cfg, tmp_path)
    cases = {
        "missing.pt": ({k: v for k, v in state.items() if k != "features.fc1.bias"},
                       "missing key features.fc1.bias"),
        "unexpected.pt": ({**state, "extra.weight": torch.zeros(2)}, "unexpected key extra.weight"),
        "shape.pt": (initial_state(cfg, tmp_path, "model.mlp_hidden=32"), "features.fc1.weight has shape (32, 64) in the file, (64, 64) in the model"),
    }
    for name, (weights, says) in cases.items():
        torch.save(weights, tmp_path / name)
        assert_refused(cfg, tmp_path / "out", [f"model.init_from={tmp_path / name}"], f"{tmp_path / name}")
        assert_refused(cfg, tmp_path / "out", [f"model.init_from={tmp_path / name}"], says)
    (tmp_path / "garbage.pt").write_bytes(b"not a state dict")
    assert_refused(cfg, tmp_path / "out", [f"model.init_from={tmp_path / 'garbage.pt'}"],
                   f"model.init_from: cannot read {tmp_path / 'garbage.pt'}")
    (tmp_path / "garbage.safetensors").write_bytes(b"\x00" * 3)
    assert_refused(cfg, tmp_path / "out", [f"model.init_from={tmp_path / 'garbage.safetensors'}"],
                   f"model.init_from: cannot read {tmp_path / 'garbage.safetensors'} as a safetensors")
    assert_refused(cfg, tmp_path / "out", [f"model.init_from={tmp_path / 'absent.pt'}"],
                   f"model.init_from: cannot read {tmp_path / 'absent.pt'}")
    (tmp_path / "not_a_run").mkdir()
    assert_refused(cfg, tmp_path / "out", [f"model.init_from={tmp_path / 'not_a_run'}"], "not a finished distfl run")


def test_a_changed_weights_file_refuses_the_resume_in_one_line(tmp_path):
    cfg = config(tmp_path)
    weights = tmp_path / "init.pt"
    torch.save(perturbed(initial_state(cfg, tmp_path)), weights)
    run_dir = tmp_path / "run"
    train_ok(cfg, f"output.dir={run_dir}", f"model.init_from={weights}", "train.rounds=2")
    before, rows = sha(weights), metrics(run_dir)
    torch.save(perturbed(perturbed(initial_state(cfg, tmp_path))), weights)
    proc = run_cli(["train", "--resume", run_dir, "train.rounds=4"])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1, line
    assert f"cannot resume {run_dir}: model.init_from {weights} changed since the run started" in line
    assert f"SHA-256 {before} when checkpointed, {sha(weights)} now" in line
    assert metrics(run_dir) == rows and summary(run_dir)["rounds"] == 2

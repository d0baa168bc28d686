"""What bit-identity rests on, checked: ranks agree on the initial model, a resume that changes the
runtime says which guarantee it loses, and an op with no deterministic kernel stops the run by name."""
from __future__ import annotations

import json

import pytest
import torch

from conftest import env_with_sitecustomize, run_cli, train_ok, write_config
from distfl import dist
from distfl.errors import ConfigError

# Loaded by Python at start-up from PYTHONPATH: on rank 1 only, every Linear layer is initialised a little
# differently, as a torch build with other kernels (or another random-number implementation) could.
PERTURB_RANK_1 = """
import os
if os.environ.get("RANK") == "1":
    import torch
    _reset = torch.nn.Linear.reset_parameters
    def reset_parameters(self):
        _reset(self)
        with torch.no_grad():
            self.weight.add_(1e-6)
    torch.nn.Linear.reset_parameters = reset_parameters
"""


def test_ranks_with_different_initial_models_stop_at_start(tmp_path):
    cfg = write_config(tmp_path / "small.yaml")
    run = tmp_path / "run"
    env = env_with_sitecustomize(tmp_path, PERTURB_RANK_1)
    proc = run_cli(["train", cfg, f"output.dir={run}"], nproc=2, env=env, timeout=300)
    assert proc.returncode != 0
    assert "ranks disagree on the initial model" in proc.stderr and "same torch build" in proc.stderr
    assert not (run / "metrics.jsonl").exists() and not (run / "checkpoints").exists()  # no round ran


@pytest.mark.parametrize("key,now", [("runtime.threads", "2"), ("runtime.deterministic", "false"),
                                     ("runtime.pack_size", "2")])
def test_resume_with_another_runtime_warns_which_guarantee_is_lost(tmp_path, small_config, key, now):
    run = tmp_path / "run"
    train_ok(small_config, f"output.dir={run}", "train.rounds=2")
    proc = run_cli(["train", "--resume", str(run), "train.rounds=3", f"{key}={now}"])
    assert proc.returncode == 0, proc.stderr
    field = key.split(".")[1]
    assert f"warning: runtime {field} was" in proc.stderr and f"is {now.replace('false', 'False')} now" in proc.stderr
    if field == "pack_size":
        assert "clients in packs of 2" in proc.stderr
    assert "no longer bit-identical" in proc.stderr
    # The same runtime resumes silently, and summary.json keeps the earlier change on record.
    proc = run_cli(["train", "--resume", str(run), "train.rounds=4", f"{key}={now}"])
    assert proc.returncode == 0 and "warning" not in proc.stderr
    was = {"device": "cpu", "threads": 1, "deterministic": True, "torch": torch.__version__, "pack_size": 1}
    changes = json.loads((run / "summary.json").read_text())["runtime_changes"]
    assert changes == [{"after_round": 2, "was": was,
                        "now": {**was, field: {"2": 2, "false": False}[now]}}]


def test_a_run_on_one_runtime_records_no_change(tmp_path, small_config):
    run = tmp_path / "run"
    train_ok(small_config, f"output.dir={run}", "train.rounds=2")
    assert run_cli(["train", "--resume", str(run), "train.rounds=3"]).returncode == 0
    assert json.loads((run / "summary.json").read_text())["runtime_changes"] == []


def test_checkpoint_records_the_runtime(tmp_path, small_config):
    run = tmp_path / "run"
    train_ok(small_config, f"output.dir={run}", "train.rounds=2")
    state = torch.load(run / "checkpoints" / "round_000002" / "state.pt", weights_only=True)
    assert state["runtime"] == {"device": "cpu", "threads": 1, "deterministic": True, "torch": torch.__version__,
                                "pack_size": 1}


def _nondeterministic_op():
    # What torch raises for such an op under use_deterministic_algorithms(True): the op itself is CUDA
    # only, so this raises through torch's own alert, which words the error as the CUDA kernels do.
    from torch._prims_common import alert_not_deterministic

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    try:
        alert_not_deterministic("adaptive_avg_pool2d_backward_cuda")
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def test_an_op_without_a_deterministic_kernel_names_the_op_and_the_option():
    with pytest.raises(RuntimeError, match="adaptive_avg_pool2d_backward_cuda does not have a deterministic"):
        _nondeterministic_op()
    with pytest.raises(ConfigError) as err:
        with dist.deterministic_ops():
            _nondeterministic_op()
    message = str(err.value)
    assert message.startswith("adaptive_avg_pool2d_backward_cuda has no deterministic implementation")
    assert "runtime.deterministic=false" in message
    with pytest.raises(RuntimeError, match="unrelated"):  # any other error passes through unchanged
        with dist.deterministic_ops():
            raise RuntimeError("unrelated")


def test_deterministic_algorithms_are_strict_unless_switched_off():
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        dist.init("cpu", 1)
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        dist.init("cpu", 1, deterministic=False)
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])

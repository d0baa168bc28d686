"""A method's state that no checkpoint could restore stops the run when it is first written, with one
line naming the method and the key, instead of a run whose every --resume fails."""
from __future__ import annotations

import pytest

from conftest import run_cli, write_config

PLUGIN = '''
from fractions import Fraction

import torch

import distfl


class OddServer(distfl.Algorithm):
    """Keeps a Fraction in its server state."""

    def server_state(self):
        return {**super().server_state(), "schedule": {"step": Fraction(1, 3)}}


class OddClient(distfl.Algorithm):
    """Keeps a Fraction in each client's state."""
    stateful = True

    def init_client_state(self):
        return {"c": torch.zeros(()), "seen": Fraction(0)}
'''


@pytest.mark.parametrize("method, where, line", [
    ("OddServer", "writing checkpoint round_000002",
     "algorithm.name=oddstate:OddServer: server_state()['schedule']['step'] is a fractions.Fraction, which a "
     "checkpoint cannot restore"),
    ("OddClient", "round 1, local training of client",
     "algorithm.name=oddstate:OddClient: the client state['seen'] is a fractions.Fraction, which a checkpoint "
     "cannot restore"),
])
@pytest.mark.parametrize("store", ["memory", "disk"])
def test_state_a_checkpoint_cannot_restore_stops_the_run_naming_method_and_key(tmp_path, monkeypatch, method,
                                                                            where, line, store):
    (tmp_path / "oddstate.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = write_config(tmp_path / "c.yaml")
    run_dir = tmp_path / "run"
    proc = run_cli(["train", cfg, f"output.dir={run_dir}", f"algorithm.name=oddstate:{method}",
                    f"runtime.client_state={store}"])
    assert proc.returncode == 1, proc.stderr
    errors = [x for x in proc.stderr.splitlines() if x.startswith("distfl: error:")]
    assert len(errors) == 1 and where in errors[0] and line in errors[0], proc.stderr
    assert not list((run_dir / "checkpoints").glob("round_*"))

"""train.lr_schedule / server.lr_schedule: the lr of every round against the formula, the lr the local
SGD and the server step really use, and resume-exactness."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import build_trainer, metrics, run_cli, train_ok
from distfl.federation.schedule import round_lr


def _section(**kw):
    base = dict(lr=0.1, lr_schedule="constant", lr_warmup_rounds=0, lr_min=0.0, lr_step_every=10, lr_gamma=0.1)
    return SimpleNamespace(**{**base, **kw})


def test_every_round_against_the_formula():
    T = 10
    assert [round_lr(_section(), t, T) for t in range(1, T + 1)] == [0.1] * T
    # Warm-up 3 rounds: 0.1/3, 0.2/3, 0.1, then constant.
    warm = [round_lr(_section(lr_warmup_rounds=3), t, T) for t in range(1, T + 1)]
    assert warm == [0.1 * (1 / 3), 0.1 * (2 / 3), 0.1] + [0.1] * 7
    # Step: halve every 3 rounds after a 1-round warm-up (u = t - 2).
    step = [round_lr(_section(lr_schedule="step", lr_warmup_rounds=1, lr_step_every=3, lr_gamma=0.5), t, T)
            for t in range(1, T + 1)]
    assert step == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.05, 0.05, 0.05, 0.025, 0.025, 0.025], rel=0, abs=1e-15)
    # Cosine from 0.1 to 0.01 over the 8 rounds after a 2-round warm-up.
    cos = [round_lr(_section(lr_schedule="cosine", lr_warmup_rounds=2, lr_min=0.01), t, T) for t in range(1, T + 1)]
    expected = [0.05, 0.1] + [0.01 + 0.09 * (1 + math.cos(math.pi * u / 8)) / 2 for u in range(8)]
    assert cos == pytest.approx(expected, rel=1e-15)
    assert cos[2] == 0.1 and cos[-1] > 0.01 and all(a > b for a, b in zip(cos[2:], cos[3:]))


@pytest.mark.parametrize("section,optimizer", [("train", "sgd"), ("server", "sgd"), ("server", "adam")])
def test_rounds_use_the_scheduled_lr(tmp_path, small_config, section, optimizer):
    """Two rounds of a step schedule (lr, then lr * 0.3) give bit for bit the model of a constant-lr run
    whose lr is set by hand to lr * 0.3 before round 2: local SGD and the server step read the schedule."""
    base = f"{section}.lr=0.08" if section == "train" else f"{section}.lr=0.8"
    common = [base, f"server.optimizer={optimizer}"]
    scheduled = build_trainer(small_config, tmp_path / "scheduled", *common, f"{section}.lr_schedule=step",
                              f"{section}.lr_step_every=1", f"{section}.lr_gamma=0.3")
    by_hand = build_trainer(small_config, tmp_path / "by_hand", *common)
    rows = [scheduled.run_round(1), scheduled.run_round(2)]
    by_hand.run_round(1)
    lr = getattr(by_hand.cfg, section).lr
    getattr(by_hand.cfg, section).lr = lr * 0.3
    by_hand.run_round(2)
    assert torch.equal(scheduled.global_params, by_hand.global_params)
    key = "lr" if section == "train" else "server_lr"
    assert [r[key] for r in rows] == [lr, lr * 0.3]
    # ... and the schedule changed the model (round 2 differs from a constant lr).
    constant = build_trainer(small_config, tmp_path / "constant", *common)
    constant.run_round(1)
    constant.run_round(2)
    assert not torch.equal(constant.global_params, scheduled.global_params)


def test_resume_equals_uninterrupted_and_lr_is_logged(tmp_path, small_config):
    """Warm-up + step on both lrs: 4 rounds, then resume to 6 == 6 rounds, and metrics log each lr."""
    args = ["train.lr_schedule=step", "train.lr_step_every=2", "train.lr_gamma=0.5", "train.lr_warmup_rounds=1",
            "server.lr_schedule=step", "server.lr_step_every=3", "server.lr_gamma=0.8"]
    through = train_ok(small_config, f"output.dir={tmp_path / 'through'}", *args)
    train_ok(small_config, f"output.dir={tmp_path / 'stopped'}", *args, "train.rounds=4")
    resumed = train_ok(None, "train.rounds=6", resume=str(tmp_path / "stopped"))
    assert resumed["model_sha256"] == through["model_sha256"]
    rows = metrics(tmp_path / "stopped")
    assert [r["lr"] for r in rows] == [0.1, 0.1, 0.1, 0.05, 0.05, 0.025]
    assert [r["server_lr"] for r in rows] == [1.0, 1.0, 1.0, 0.8, 0.8, 0.8]


def test_cosine_run_cannot_be_extended_on_resume(tmp_path, small_config):
    train_ok(small_config, f"output.dir={tmp_path / 'run'}", "train.lr_schedule=cosine", "train.rounds=4")
    proc = run_cli(["train", "--resume", str(tmp_path / "run"), "train.rounds=6"])
    assert proc.returncode != 0 and "train.rounds" in proc.stderr and "Traceback" not in proc.stderr


def test_bad_values_name_the_key(tmp_path, small_config):
    for arg, key in [("train.lr_schedule=cosin", "train.lr_schedule"), ("server.lr_step_every=0", "server.lr_step_every"),
                     ("train.lr_warmup_rounds=-1", "train.lr_warmup_rounds")]:
        proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'bad'}", arg])
        assert proc.returncode == 2 and key in proc.stderr, proc.stderr
        assert not (tmp_path / "bad").exists()
    proc = run_cli(["train", str(small_config), f"output.dir={tmp_path / 'adc'}", "algorithm.name=fedadc",
                    "train.lr_schedule=cosine"])
    assert proc.returncode == 2 and "train.lr_schedule must be constant" in proc.stderr, proc.stderr

"""The parts of a run outside its round loop take the objects they read, not the Trainer: stopping.py the
stop flags and an action, the run directory its path, its lock and --overwrite (run_dir.RunDirectory).
Each is exercised here alone, with no data, model or Trainer."""
from __future__ import annotations

import os
import signal

import pytest

from distfl import dist, launcher
from distfl.config import load_config
from distfl.errors import CheckpointError, ConfigError
from distfl.federation import stopping
from distfl.federation.run_dir import RunDirectory
from distfl.federation.run_state import StopFlags


def test_ctrl_c_asks_for_a_checkpoint_and_a_second_one_stops_at_once(tmp_path):
    stop, asked = StopFlags(), []

    def request(reason):
        asked.append(stopping.REASONS[reason])
        stop.requested = True

    previous = stopping.catch_stop_signals(stop, request, tmp_path)
    try:
        os.kill(os.getpid(), signal.SIGINT)
        assert asked == ["Ctrl-C (SIGINT)"] and stop.interrupts == 1 and stop.launcher is None
        with pytest.raises(stopping.StoppedAtOnce) as second:
            os.kill(os.getpid(), signal.SIGINT)
        assert second.value.run_dir == tmp_path and asked == ["Ctrl-C (SIGINT)"]
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        launcher.training(False)


def test_a_run_directory_is_claimed_locked_and_cleared_only_under_overwrite(tmp_path):
    ctx = dist.init("cpu", 1)
    path = tmp_path / "run"
    path.mkdir()
    (path / "summary.json").write_text("{}")
    cfg = load_config(None, [f"output.dir={path}"])
    kept = RunDirectory(path, ctx, overwrite=False)
    try:
        with pytest.raises(ConfigError, match="already holds a run"):
            kept.prepare(cfg, None, None, [])
        assert (path / "summary.json").exists()
        with pytest.raises(CheckpointError):  # rank 0 of this run holds the lock
            RunDirectory(path, ctx, overwrite=True)
    finally:
        kept.close()
    cleared = RunDirectory(path, ctx, overwrite=True)
    try:
        cleared.prepare(cfg, None, None, [])
        assert not (path / "summary.json").exists() and (path / "config.yaml").is_file()
    finally:
        cleared.close()

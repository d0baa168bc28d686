"""What a user reads when something is off: each message says what happened and what to do, without
a traceback, a source line of distfl, or advice that would delete finished work."""
from __future__ import annotations

import shutil

from conftest import run_cli, summary, train_ok, write_config


def test_a_finished_run_without_checkpoints_is_not_advised_to_be_overwritten(tmp_path, small_config):
    """A completed run whose checkpoints were deleted: a new start, and --resume, say it finished and
    where its results are, not that it stopped before its first checkpoint."""
    run = tmp_path / "run"
    done = train_ok(small_config, f"output.dir={run}", "train.rounds=2")
    shutil.rmtree(run / "checkpoints")
    for args in (["train", small_config, f"output.dir={run}", "train.rounds=2"], ["train", "--resume", run]):
        proc = run_cli(args)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip()
        assert len(line.splitlines()) == 1
        assert (f"it finished (completed after 2 rounds, final test accuracy {100 * done['final_test_acc']:.2f}%) "
                f"and its checkpoints were deleted since; its results are in {run / 'summary.json'}") in line
        assert "stopped before its first checkpoint" not in line and "start it over with --overwrite" not in line
    assert summary(run) == done

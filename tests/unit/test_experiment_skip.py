"""experiments/lib.sh's `ended DIR`: the experiment scripts skip a run only when it ended (completed
over the rounds its config asks for, or diverged); a stopped, running or failed run is run again."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def ended(run_dir: Path) -> bool:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "-c", f'. {REPO}/experiments/lib.sh && ended "$1"', "_", str(run_dir)],
                          env=env, capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


def write_run(path: Path, status: str | None, rounds: int, config_rounds: int | None = None) -> Path:
    path.mkdir(parents=True)
    if status is not None:
        (path / "summary.json").write_text(json.dumps({"status": status, "rounds": rounds}))
    if config_rounds is not None:
        (path / "config.yaml").write_text(f"train:\n  rounds: {config_rounds}\n")
    return path


@pytest.mark.parametrize("status, rounds, config_rounds, expected", [
    ("completed", 10, 10, True),
    ("completed", 10, None, True),       # a results folder holding only summary.json and metrics.jsonl
    ("diverged", 3, 10, True),
    ("stopped", 4, 10, False),
    ("running", 4, 10, False),
    ("failed", 4, 10, False),
    ("completed", 10, 20, False),        # an old summary kept by a resume to more rounds that did not end
    (None, 0, 10, False),                # no summary.json at all
])
def test_ended_skips_only_runs_that_ended(tmp_path, status, rounds, config_rounds, expected):
    assert ended(write_run(tmp_path / "run", status, rounds, config_rounds)) is expected


def test_a_damaged_summary_is_not_ended(tmp_path):
    run = write_run(tmp_path / "run", "completed", 10, 10)
    (run / "summary.json").write_text('{"status": "compl')
    assert ended(run) is False

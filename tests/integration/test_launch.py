"""`distfl train --nproc N`: distfl starts torchrun and answers Ctrl-C itself, so a stop under torchrun
ends as a single-process one does: one checkpoint, one line, status 3, no launcher traceback; and the
run resumes to the uninterrupted model."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, env_with_sitecustomize, run_cli, train_ok, write_config
from test_faults import SITE_SLOW_ROUNDS  # rank 0 marks round 2's start; every round takes at least 0.5 s

def test_ctrl_c_under_distfl_train_nproc_checkpoints_and_exits_3_in_one_line(tmp_path):
    cfg = write_config(tmp_path / "c.yaml")
    run_dir = tmp_path / "run"
    marker = tmp_path / "round2"
    env = env_with_sitecustomize(tmp_path, SITE_SLOW_ROUNDS, SLOW_ROUNDS=str(marker))
    # Its own session, as a shell puts a foreground job in its own process group: Ctrl-C is a SIGINT to it.
    proc = subprocess.Popen([sys.executable, "-m", "distfl", "train", str(cfg), "--nproc", "2",
                             f"output.dir={run_dir}", "checkpoint.every=0"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 180
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 3, err
    assert "Traceback" not in err and "ChildFailedError" not in err and "SignalException" not in err, err
    assert err.count("checkpoint written after round 2") == 1 and f"distfl train --resume {run_dir}" in err
    assert [p.name for p in (run_dir / "checkpoints").glob("round_*")] == ["round_000002"]
    resumed = train_ok(None, resume=str(run_dir))
    through = train_ok(cfg, f"output.dir={tmp_path / 'through'}")
    assert resumed["model_sha256"] == through["model_sha256"]


def test_nproc_refuses_a_bad_config_before_torchrun_starts(tmp_path):
    proc = run_cli(["train", write_config(tmp_path / "c.yaml"), "--nproc", "2", "train.roundz=3"])
    assert proc.returncode == 2 and "did you mean 'train.rounds'" in proc.stderr and "torch.distributed" not in proc.stderr


@pytest.mark.parametrize("args, line", [
    (["seed=1"], "distfl: error: distfl train needs a CONFIG file (or --resume RUN_DIR)"),
    (["--resume", "{tmp}/no_run"], "distfl: error: --resume {tmp}/no_run: no config.yaml there"),
    (["{tmp}/c.yaml", "--resume", "{tmp}/no_run"], "distfl: error: give either CONFIG or --resume RUN_DIR, not both"),
])
def test_nproc_refuses_a_missing_or_doubled_target_before_torchrun_starts(tmp_path, args, line):
    write_config(tmp_path / "c.yaml")
    proc = run_cli(["train", *[a.format(tmp=tmp_path) for a in args], "--nproc", "2"])
    assert proc.returncode == 2 and proc.stderr.startswith(line.format(tmp=tmp_path)), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1

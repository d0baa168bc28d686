"""A run that ends before its last round never looks finished: for each way it can stop early, a real
process run, its exit status, its one line (why, and the command that continues it) and summary.json's
status. The runs are FedProx's straggler setting on its Synthetic(1,1) federation (stragglers doing
partial work), stopped in a run resumed to more rounds than its checkpoint's config, as a 200-round
run resumed from its round-100 checkpoint is."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, env_with_sitecustomize, metrics, run_cli, summary, train_ok, write_config

STRAGGLERS = {
    "seed": 0,
    "data": {"dataset": "fedprox_synthetic", "synthetic_alpha": 1.0, "synthetic_beta": 1.0, "synthetic_iid": False},
    "partition": {"scheme": "natural", "num_clients": 30, "seed": 0},
    "model": {"name": "mclr"},
    "algorithm": {"name": "fedprox", "options": {"mu": 0.0}},
    "train": {"rounds": 10, "clients_per_round": 10, "local_epochs": 2, "batch_size": 10, "lr": 0.01},
    "eval": {"every": 1},
    "checkpoint": {"every": 5, "keep": 1},
    "output": {"progress": "log", "tensorboard": False},
    "system": {"round": "stragglers", "stragglers": 0.9, "partial_work": True},
}

# Round $STOP_AT_ROUND (on rank $STOP_RANK, default 0) marks its start in $STOP_MARK and waits for a stop
# request before it trains (marking it in $STOP_MARK.requested); with $STOP_HOLD it goes on waiting after
# it, for a second Ctrl-C or a kill. The 300 s are a guard against a hang, not a measured bound.
SITE_STOP_IN_ROUND = """
import os
if "STOP_AT_ROUND" in os.environ and os.environ.get("RANK", "0") == os.environ.get("STOP_RANK", "0"):
    import time
    from pathlib import Path
    from distfl.federation import runner

    _run_round = runner.Trainer.run_round

    def run_round(self, round_idx):
        if round_idx == int(os.environ["STOP_AT_ROUND"]):
            mark = Path(os.environ["STOP_MARK"])
            mark.touch()
            deadline = time.time() + 300
            while time.time() < deadline:
                if self.stop.requested:
                    Path(f"{mark}.requested").touch()
                    if "STOP_HOLD" not in os.environ:
                        break
                time.sleep(0.05)
        return _run_round(self, round_idx)

    runner.Trainer.run_round = run_round
"""


@pytest.fixture
def config(tmp_path) -> Path:
    return write_config(tmp_path / "stragglers.yaml", STRAGGLERS)


@pytest.fixture
def through(config, tmp_path) -> dict:
    """The same run trained to round 20 without a stop."""
    return train_ok(config, f"output.dir={tmp_path / 'through'}", "train.rounds=20")


def _start(tmp_path: Path, args: list, stop_at: int, **env) -> tuple[subprocess.Popen, Path]:
    """`distfl ARGS` in a session of its own, once round `stop_at` (of the rank that waits) has begun."""
    mark = tmp_path / f"round{stop_at}"
    environ = env_with_sitecustomize(tmp_path, SITE_STOP_IN_ROUND, STOP_AT_ROUND=str(stop_at), STOP_MARK=str(mark),
                                     **env)
    proc = subprocess.Popen([sys.executable, "-m", "distfl", *map(str, args)], cwd=REPO, env=environ,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for(mark, proc)
    return proc, mark


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.time() + 300  # a guard against a hang, not a measured bound
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    assert path.exists(), proc.communicate()


def _stopped_at_10(config: Path, tmp_path: Path) -> Path:
    """A finished 10-round run (checkpoint of round 10 only: every 5, keep 1), to be resumed to 20."""
    run = tmp_path / "run"
    done = train_ok(config, f"output.dir={run}")
    assert (done["status"], done["finished"], done["round_reached"], done["train_rounds"]) == ("completed", True, 10, 10)
    assert done["stopped_because"] is None and done["resume_command"] is None
    return run


def _last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("sig,why", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C (SIGINT)"),
                                     (signal.SIGUSR1, "SIGUSR1")])
def test_a_signal_stops_a_resumed_run_as_stopped_not_finished(config, tmp_path, through, sig, why):
    """Resumed from round 10 to 20 and signalled in round 13: exit 3, one line naming the signal, the round
    and `distfl train --resume RUN`; summary.json "stopped" at round 13 of 20, not the earlier session's
    "completed" at 10. `distfl report` lists it as stopped, not among the completed. Resumed again, it
    ends with the model of the run trained to 20 without a stop."""
    run = _stopped_at_10(config, tmp_path)
    proc, _ = _start(tmp_path, ["train", "--resume", run, "train.rounds=20"], stop_at=13)
    os.kill(proc.pid, sig)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 3, err
    line = _last_line(err)
    assert line.startswith(f"distfl: stopped by {why}") and "checkpoint written after round 13 of 20" in line, err
    assert line.endswith(f"continue with `distfl train --resume {run}`"), err
    s = summary(run)
    assert (s["status"], s["finished"], s["round_reached"], s["train_rounds"]) == ("stopped", False, 13, 20)
    assert s["stopped_because"].startswith(why) and s["resume_command"] == f"distfl train --resume {run}"
    assert (run / "checkpoints" / "latest").read_text().strip() == "round_000013"
    # No final or best result of a run that did not finish: its last evaluation is under last_eval.
    assert s["final_test_acc"] is s["best_test_acc"] is None
    assert s["last_eval"]["round"] == 13 and s["last_eval"]["final_test_acc"] == metrics(run)[-1]["test_acc"]

    report = run_cli(["report", run, "--out", tmp_path / "report"])
    assert report.returncode == 0, report.stderr
    assert f"- {run}: stopped by {s['stopped_because']} at round 13 of 20, 13 rounds logged" in report.stdout

    resumed = train_ok(None, resume=str(run))
    assert (resumed["status"], resumed["finished"], resumed["round_reached"]) == ("completed", True, 20)
    assert resumed["model_sha256"] == through["model_sha256"]
    assert [r["round"] for r in metrics(run)] == list(range(1, 21))


def test_kill_9_of_a_resumed_session_leaves_it_running_not_completed(config, tmp_path, through):
    """A resume to more rounds killed without a word (kill -9; SIGHUP acts alike): summary.json says
    "running" from the moment the session begins training, never the earlier session's "completed", so a
    sweep resumes it and `distfl report` does not count it."""
    run = _stopped_at_10(config, tmp_path)
    proc, _ = _start(tmp_path, ["train", "--resume", run, "train.rounds=20"], stop_at=12, STOP_HOLD="1")
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL
    s = summary(run)
    assert (s["status"], s["finished"], s["train_rounds"]) == ("running", False, 20)
    assert s["resume_command"] == f"distfl train --resume {run}"
    assert s["final_test_acc"] is None and s["last_eval"]["round"] == 10  # the earlier session's, not final

    from distfl.sweep.state import point_state
    import yaml

    assert point_state(run, yaml.safe_load((run / "config.yaml").read_text())) == "resume"
    report = run_cli(["report", run, "--out", tmp_path / "report"])
    assert report.returncode == 0 and f"- {run}: running at round 10 of 20" in report.stdout, report.stdout

    assert train_ok(None, resume=str(run))["model_sha256"] == through["model_sha256"]


def test_a_second_ctrl_c_leaves_the_summary_stopped(config, tmp_path):
    """A second Ctrl-C stops at once (exit 130, its line); summary.json says "stopped" with why, where a
    resume continues, and no hash of the half-updated model."""
    run = _stopped_at_10(config, tmp_path)
    proc, mark = _start(tmp_path, ["train", "--resume", run, "train.rounds=20"], stop_at=12, STOP_HOLD="1")
    os.kill(proc.pid, signal.SIGINT)
    _wait_for(Path(f"{mark}.requested"), proc)
    os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert _last_line(err).startswith("distfl: stopped at once by a second Ctrl-C"), err
    s = summary(run)
    assert (s["status"], s["finished"], s["round_reached"], s["train_rounds"]) == ("stopped", False, 11, 20)
    assert s["stopped_because"] == ("a second Ctrl-C, at once, in round 12, without its checkpoint; a resume "
                                    "continues from checkpoint round_000010")
    assert s["model_sha256"] is None and s["resume_command"] == f"distfl train --resume {run}"


@pytest.mark.parametrize("target", ["rank", "launcher"])
def test_distfl_train_nproc_exits_3_whichever_process_the_signal_reaches(config, tmp_path, target):
    """`distfl train --nproc 2`: SIGTERM to its launcher, or to one rank only (a kill, a preempted node):
    exit 3 and rank 0's line naming the signal and the command with --nproc (a SIGTERM to rank 1 alone
    ended this command with status 0 before). The summary says why, whichever rank was signalled."""
    run = tmp_path / "run"
    args = ["train", config, f"output.dir={run}", "--nproc", "2"]
    proc, _ = _start(tmp_path, args, stop_at=3, STOP_RANK="1" if target == "rank" else "0")
    if target == "rank":
        torchrun = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        ranks = subprocess.run(["pgrep", "-P", torchrun[0]], capture_output=True, text=True).stdout.split()
        rank1 = next(int(p) for p in ranks if "RANK=1" in Path(f"/proc/{p}/environ").read_text().split("\0"))
        os.kill(rank1, signal.SIGTERM)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    why = "SIGTERM" if target == "rank" else "SIGUSR1"  # the launcher asks its ranks with SIGUSR1
    assert proc.returncode == 3, err
    line = _last_line(err)
    assert line.startswith(f"distfl: stopped by {why}") and "checkpoint written after round 3 of 10" in line, err
    assert line.endswith(f"continue with `distfl train --resume {run} --nproc 2`"), err
    s = summary(run)
    assert (s["status"], s["finished"], s["round_reached"]) == ("stopped", False, 3)
    assert s["stopped_because"].startswith(why) and s["resume_command"] == f"distfl train --resume {run} --nproc 2"


def test_report_does_not_count_a_completed_summary_of_fewer_rounds_than_its_config(tmp_path):
    """A summary.json written before distfl marked resumed sessions "running": "completed" after 4 rounds,
    kept by a resume to 8 rounds that was killed. `distfl report` lists the run as unfinished."""
    run = tmp_path / "run"
    train_ok(write_config(tmp_path / "small.yaml"), f"output.dir={run}", "train.rounds=4")
    saved = run / "config.yaml"
    assert saved.read_text().count("\n  rounds: 4\n") == 1
    saved.write_text(saved.read_text().replace("\n  rounds: 4\n", "\n  rounds: 8\n"))
    proc = run_cli(["report", run, "--out", tmp_path / "report"])
    assert proc.returncode == 0, proc.stderr
    assert f"- {run}: unfinished, 4 rounds logged" in proc.stdout, proc.stdout


def test_a_slurm_task_takes_only_a_diverged_summary_for_a_finished_point(tmp_path):
    """A sweep's Slurm task whose resume fails (here: every checkpoint damaged) beside a summary.json that
    says "stopped" reports the failure; only a "diverged" summary makes the point finished."""
    import json

    from distfl.config import config_to_dict, load_config
    from distfl.sweep.slurm import SweepJob

    run = tmp_path / "run"
    cfg = write_config(tmp_path / "small.yaml")
    train_ok(cfg, f"output.dir={run}", "train.rounds=4", "checkpoint.keep=1")
    for state in (run / "checkpoints").glob("round_*/state.pt"):
        state.write_bytes(b"damaged")
    done = summary(run)
    job = SweepJob(config_to_dict(load_config(str(cfg), [f"output.dir={run}", "train.rounds=8"])))
    for status in ("stopped", "diverged"):
        (run / "summary.json").write_text(json.dumps({**done, "status": status}))
        if status == "stopped":
            with pytest.raises(RuntimeError, match="no good checkpoint|cannot resume|checkpoint"):
                job()
        else:
            assert job()["status"] == "diverged"

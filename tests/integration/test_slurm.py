"""Slurm: rank and rendezvous from the Slurm environment, and sweeps on a real one-node Slurm that the
session fixture starts (slurm/dev-cluster.sh): jobs through submitit give the local torchrun model,
and a requeued job resumes from its checkpoint with no lost or repeated round.

The Slurm tests need root (to start the daemons) and the Debian packages (`make slurm`). Without
root they are skipped, saying so. Without the packages they are skipped too, except where
DISTFL_REQUIRE_SLURM=1 (set by `make test`, so CI): there a missing or broken Slurm is a failure.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, metrics, run_cli, slow_first_round, summary, train_ok, wait_for_marks, write_config
from distfl.dist import expand_hostlist, slurm_environment, slurm_port
from distfl.sweep import slurm_active_jobs, wait_for_jobs

DEV_CLUSTER = REPO / "slurm" / "dev-cluster.sh"


# --- without Slurm --------------------------------------------------------------------------------

def test_slurm_environment_gives_ranks_and_rendezvous():
    env = {"SLURM_PROCID": "5", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "8", "SLURM_NTASKS": "16",
           "SLURM_LOCALID": "1", "SLURM_STEP_NODELIST": "gpu[007-008,010],cpu1", "SLURM_JOB_ID": "4242"}
    got = slurm_environment(env)
    assert got == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu007",
                   "MASTER_PORT": str(slurm_port(4242))}
    # A requeued job (new allocation) gets another port; explicit MASTER_ADDR/PORT win.
    assert slurm_environment({**env, "SLURM_RESTART_COUNT": "1"})["MASTER_PORT"] != got["MASTER_PORT"]
    assert slurm_environment({**env, "MASTER_ADDR": "h", "MASTER_PORT": "1234"})["MASTER_ADDR"] == "h"
    # The batch script itself (no job step) is one process, not SLURM_NTASKS ranks.
    assert slurm_environment({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "1"}) is None
    assert expand_hostlist("gpu[007-008,010],cpu1") == ["gpu007", "gpu008", "gpu010", "cpu1"]
    assert expand_hostlist("r[1-2]-n[1,3]") == ["r1-n1", "r1-n3", "r2-n1", "r2-n3"]
    assert all(20000 <= slurm_port(j, r) < 32000 for j in range(0, 10**6, 9973) for r in range(3))


def test_distfl_train_takes_its_ranks_from_the_slurm_environment(tmp_path):
    """Two processes with the variables srun gives its tasks (no torchrun): one run of world size 2,
    the same model as one process."""
    cfg = write_config(tmp_path / "c.yaml")
    one = train_ok(cfg, f"output.dir={tmp_path / 'one'}")
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                     "MASTER_"))}
    common = {**base, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "SLURM_JOB_ID": str(random.randint(1, 10**6)),
              "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2",
              "SLURM_STEP_NODELIST": "localhost"}
    procs = [subprocess.Popen([sys.executable, "-m", "distfl", "train", str(cfg), f"output.dir={tmp_path / 'two'}"],
                              cwd=REPO, env={**common, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs
    assert "final test accuracy" in outputs[0][0] and "final test accuracy" not in outputs[1][0]
    two = summary(tmp_path / "two")
    assert two["world_size"] == 2 and two["model_sha256"] == one["model_sha256"]


# --- a real Slurm ---------------------------------------------------------------------------------

def _sinfo_ok() -> bool:
    if shutil.which("sinfo") is None:
        return False
    proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    return proc.returncode == 0 and any(s.startswith(("idle", "mix", "alloc")) for s in proc.stdout.split())


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running Slurm: the one this machine already has up, or a one-node dev cluster started here."""
    required = os.environ.get("DISTFL_REQUIRE_SLURM") == "1"
    if os.geteuid() != 0:
        pytest.skip("the Slurm tests start a one-node Slurm with slurm/dev-cluster.sh, which needs root")
    if _sinfo_ok():
        yield "existing"
        return
    if not (shutil.which("slurmctld") or Path("/usr/sbin/slurmctld").exists()):
        message = ("Slurm is not installed: `make slurm` (apt-get install -y slurmctld slurmd slurm-client munge) "
                   "installs it")
        if required:
            pytest.fail(message)
        pytest.skip(message)
    proc = subprocess.run([str(DEV_CLUSTER), "start"], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not _sinfo_ok():
        pytest.fail(f"slurm/dev-cluster.sh start failed:\n{proc.stdout}\n{proc.stderr}")
    try:
        yield "dev-cluster"
    finally:
        subprocess.run([str(DEV_CLUSTER), "stop"], capture_output=True, text=True, timeout=120)


def _wait(job_ids, timeout_s=540, run_dir: Path | None = None, logs: tuple[Path, str] | None = None):
    """Wait for jobs; a requeued job waits ~2 minutes for its begin time, which Slurm sets on requeue:
    the test lets it start 5 s after it is seen pending (the only thing it changes is the scheduling
    delay). Not at once: slurmd refuses a job whose credential is no newer, in whole seconds, than the
    revocation of its previous run's ("Killing non-startable batch JobId=N: Job credential revoked"),
    and the job then ends FAILED; a start forced in the second of the requeue did that. With `run_dir`,
    also until that run has completed: a job that requeues itself can be missing from squeue for a moment
    between its first run's end and its requeue, which once ended the wait before the resumed run. A run
    whose jobs have all been gone for a minute will not complete: that fails at once, with the jobs'
    state and the tails of the files that `logs` = (folder, glob pattern) names (their Slurm output), so
    that a failure says what the job did."""
    forced = {}  # job -> when its start was last brought forward

    def start_pending_soon(active):
        states = slurm_active_jobs()
        for job in active:
            if states.get(job) == "PENDING" and time.time() - forced.get(job, 0) > 30:
                subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now+5"], capture_output=True)
                forced[job] = time.time()

    deadline, gone_since = time.time() + timeout_s, None
    while True:
        wait_for_jobs(job_ids, timeout_s=max(1.0, deadline - time.time()), poll_s=1, on_poll=start_pending_soon)
        done = run_dir is None or ((run_dir / "summary.json").exists() and summary(run_dir)["status"] == "completed")
        if done:
            return
        active = set(slurm_active_jobs()) & set(job_ids)
        gone_since = None if active else (gone_since or time.time())
        if time.time() > deadline or (gone_since is not None and time.time() - gone_since > 60):
            raise TimeoutError(f"{run_dir} did not complete ({'jobs gone for 60 s' if gone_since else 'timeout'})"
                               f":\n{_jobs_report(job_ids, run_dir, logs)}")
        time.sleep(2)


def _jobs_report(job_ids, run_dir: Path | None, logs) -> str:
    parts = [subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
             for job in job_ids]
    if run_dir is not None and (run_dir / "summary.json").exists():
        parts.append(f"summary status: {summary(run_dir)['status']}")
    for path in sorted(logs[0].glob(logs[1])) if logs else ():
        parts.append(f"--- {path} (last 4000 characters)\n{path.read_text(errors='replace')[-4000:]}")
    return "\n".join(parts)


def _points(sweep_dir: Path) -> list[dict]:
    return json.loads((sweep_dir / "sweep.json").read_text())["points"]


def test_sweep_through_submitit_equals_local_torchrun(slurm_cluster, tmp_path):
    """2 points x 2 ranks: one job array on Slurm, each job 2 tasks; the same models as torchrun here."""
    cfg = write_config(tmp_path / "c.yaml", output={"dir": str(tmp_path / "slurm")})
    grid = ["--grid", "algorithm.name=fedavg,fedprox"]
    # sbatch's own refusal: a clear error, nothing submitted or left behind.
    proc = run_cli(["sweep", cfg, *grid, "--executor", "slurm", "--partition", "no-such-partition"])
    assert proc.returncode == 2 and "sbatch refused the sweep, nothing was submitted" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "slurm").exists()
    proc = run_cli(["sweep", cfg, *grid, "--executor", "slurm", "--tasks-per-node", "2", "--time", "10", "--wait"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    local = run_cli(["sweep", cfg, *grid, "--nproc", "2", f"output.dir={tmp_path / 'local'}"])
    assert local.returncode == 0, local.stdout + local.stderr

    points = _points(tmp_path / "slurm")
    assert [p["name"] for p in points] == ["algorithm.name=fedavg/seed=3", "algorithm.name=fedprox/seed=3"]
    array = {p["job_id"].split("_")[0] for p in points}
    assert len(array) == 1 and all("_" in p["job_id"] for p in points)  # one job array
    for p in points:
        on_slurm, here = summary(tmp_path / "slurm" / p["name"]), summary(tmp_path / "local" / p["name"])
        assert on_slurm["status"] == "completed" and on_slurm["world_size"] == 2 and here["world_size"] == 2
        assert on_slurm["model_sha256"] == here["model_sha256"], p["name"]

    # Submitting the finished sweep again submits nothing.
    proc = run_cli(["sweep", cfg, *grid, "--executor", "slurm", "--tasks-per-node", "2"])
    assert proc.returncode == 0 and "2 already finished; submitting 0" in proc.stdout


@pytest.mark.parametrize("how", ["scontrol_requeue", "time_limit_signal"])
def test_interrupted_job_resumes_from_its_checkpoint(slurm_cluster, tmp_path, how):
    """`scontrol requeue` (what preemption with requeue also does: SIGTERM, then the job comes back) or
    the USR2 that Slurm sends signal_delay_s before the time limit (the job requeues itself): the
    ranks checkpoint after the round they agree on, the job starts again and resumes there. Same
    model as an uninterrupted run, every round once in metrics.jsonl."""
    rounds = 60
    cfg = write_config(tmp_path / "c.yaml", train={"rounds": rounds}, checkpoint={"every": 0},
                       eval={"every": 20}, output={"dir": str(tmp_path / "sw")})
    through = train_ok(cfg, f"output.dir={tmp_path / 'through'}")
    proc = run_cli(["sweep", cfg, "--executor", "slurm", "--tasks-per-node", "2", "--time", "10"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (point,) = _points(tmp_path / "sw")
    job, run = point["job_id"], Path(point["run_dir"])

    deadline = time.time() + 300
    while time.time() < deadline and not ((run / "metrics.jsonl").exists() and len(metrics(run)) >= 3):
        time.sleep(0.05)
    seen = len(metrics(run))
    assert 3 <= seen < rounds, "the job finished before it could be interrupted"
    if how == "scontrol_requeue":
        subprocess.run(["scontrol", "requeue", job], check=True)
    else:
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
    # Submitting the sweep again meanwhile leaves the point to its job, which is still in the queue.
    again = run_cli(["sweep", cfg, "--executor", "slurm", "--tasks-per-node", "2"])
    assert again.returncode == 0 and f"still queued or running on Slurm (left alone: seed=3 as job {job})" \
        in again.stdout, again.stdout + again.stderr
    assert _points(tmp_path / "sw")[0]["job_ids"] == [job]
    _wait([job], run_dir=run, logs=(tmp_path / "sw" / "slurm-logs", f"{job}_*_log.*"))

    log = "".join(p.read_text() for p in sorted((tmp_path / "sw" / "slurm-logs").glob(f"{job}_*_log.*")))
    resumed_at = [int(m) for m in re.findall(r"resuming \S+ at round (\d+)", log)]
    assert resumed_at and resumed_at[0] - 1 >= seen, log  # the checkpoint holds every round seen before
    show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "Restarts=1" in show, show
    s = summary(run)
    assert s["status"] == "completed" and s["world_size"] == 2
    assert s["model_sha256"] == through["model_sha256"]
    assert [r["round"] for r in metrics(run)] == list(range(1, rounds + 1))


def _sbatch_and_wait(args: list[str], tmp_path: Path, env: dict) -> str:
    """Submit a batch job, wait until it has left the queue, and return its Slurm output. It is watched each
    second (`_wait`), not with `sbatch --wait`, which looks after 2, 10, 42 s, then every 32 s: a job that
    ends in 12 s held the test 42 s. The job ended as `sbatch --wait` would have exited 0: COMPLETED, exit
    code 0 (Slurm keeps a finished job's record MinJobAge = 300 s)."""
    proc = subprocess.run(["sbatch", "--parsable", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    _wait([job], logs=(tmp_path, "slurm-*.out"))
    logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in show and "ExitCode=0:0" in show, show + logs
    return logs


def test_sbatch_template_runs_and_continues(slurm_cluster, tmp_path):
    """slurm/train.sbatch on one node, torchrun with 2 ranks behind srun and a c10d rendezvous; submitted
    again when finished, it does nothing."""
    cfg = write_config(tmp_path / "c.yaml")
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHON": sys.executable, "NPROC_PER_NODE": "2"}
    sbatch = ["--nodes=1", "--cpus-per-task=2", "--time=10", f"--output={tmp_path}/slurm-%j.out",
              str(REPO / "slurm" / "train.sbatch"), str(cfg), f"output.dir={tmp_path / 'run'}"]
    _sbatch_and_wait(sbatch, tmp_path, env)
    s = summary(tmp_path / "run")
    assert s["status"] == "completed" and s["world_size"] == 2
    assert s["model_sha256"] == train_ok(cfg, f"output.dir={tmp_path / 'one'}")["model_sha256"]
    assert "has finished (completed); nothing to do" in _sbatch_and_wait(sbatch, tmp_path, env)



def test_sbatch_time_limit_signal_checkpoints_a_round_longer_than_30s(slurm_cluster, tmp_path):
    """The USR1 that `--signal=B:USR1@180` sends the batch script ahead of the time limit, arriving with
    more than 30 s of the round left (torchrun's agent kills its ranks 30 s after a SIGTERM): every rank
    checkpoints that round, the job requeues itself and resumes after it, and ends with the model of
    an uninterrupted run."""
    cfg = write_config(tmp_path / "c.yaml", train={"rounds": 2}, checkpoint={"every": 0}, eval={"every": 2})
    through = train_ok(cfg, f"output.dir={tmp_path / 'through'}")
    env, marks = slow_first_round(tmp_path)
    env.update(PYTHON=sys.executable, NPROC_PER_NODE="2")
    run = tmp_path / "run"
    proc = subprocess.run(["sbatch", "--parsable", "--nodes=1", "--cpus-per-task=2", "--time=10",
                           f"--output={tmp_path}/slurm-%j.out", str(REPO / "slurm" / "train.sbatch"), str(cfg),
                           f"output.dir={run}"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip().split(";")[0]
    wait_for_marks(marks, 2)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True)  # what --signal=B:USR1 does
    _wait([job], run_dir=run, logs=(tmp_path, "slurm-*.out"))

    log = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert "checkpoint written after round 1 of 2" in log and "not finished" in log, log
    assert re.findall(r"resuming \S+ at round (\d+)", log) == ["2"], log
    s = summary(run)
    assert s["status"] == "completed" and s["world_size"] == 2
    assert s["model_sha256"] == through["model_sha256"]
    assert [r["round"] for r in metrics(run)] == [1, 2]

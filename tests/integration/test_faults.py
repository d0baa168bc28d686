"""Faults during a run end in one clear line, and never lose a finished run (issue 27).

Disk full is simulated with a writer that raises OSError(ENOSPC) (every file distfl writes goes through
checkpoint.write_bytes), and, where the tests run as root, with a real tmpfs that fills up."""
from __future__ import annotations

import errno
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, env_with_sitecustomize, run_cli, summary, train_ok, write_config


def leftovers(run_dir: Path) -> list[str]:
    """Temporary files and checkpoints being assembled: what a failed write must not leave behind."""
    return sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob(".*") if ".tmp" in p.name or
                  p.name.endswith(".partial"))


def one_error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.startswith("distfl: error:")]
    assert len(lines) == 1, stderr
    # No distfl frame on screen (torchrun's launcher prints its own traceback of ChildFailedError).
    assert not re.search(r'File ".*/distfl/', stderr), stderr
    return lines[0]


@pytest.fixture(scope="module")
def through(tmp_path_factory):
    """The uninterrupted 6-round run everything here is compared with."""
    tmp = tmp_path_factory.mktemp("through")
    cfg = write_config(tmp / "small.yaml")
    return train_ok(cfg, f"output.dir={tmp / 'run'}")


# ---- 1: two starts racing on one directory ------------------------------------------------------------
def test_a_run_finished_while_another_started_is_never_deleted(tmp_path, small_config, monkeypatch):
    """The slow start looks for a run before the fast one has written, loads its data while the fast one
    runs to its end, then must refuse: the finished run stays whole."""
    from distfl.federation import runner

    run_dir = tmp_path / "run"
    load_dataset, fast = runner.load_dataset, {}

    def slow_load(*args, **kwargs):
        if not fast:  # the slow run's data load: meanwhile, another run starts and finishes here
            fast["started"] = True
            fast["summary"] = train_ok(small_config, f"output.dir={run_dir}", "seed=4")
        return load_dataset(*args, **kwargs)

    monkeypatch.setattr(runner, "load_dataset", slow_load)
    proc = run_cli(["train", small_config, f"output.dir={run_dir}"])
    assert proc.returncode == 2
    assert f"output.dir {run_dir} already holds a run" in one_error_line(proc.stderr)
    assert summary(run_dir) == fast["summary"]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == \
        ["latest", "round_000002", "round_000004", "round_000006"]
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 6


# ---- 2: disk full ---------------------------------------------------------------------------------------
def full_disk_writer(monkeypatch, failing):
    """Patch the one writer every file goes through: paths for which `failing(path)` holds raise ENOSPC
    (as a write() does: without the file's name)."""
    from distfl import checkpoint

    write_file = checkpoint._write_file

    def writer(data, path):
        if failing(Path(path)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        write_file(data, path)

    monkeypatch.setattr(checkpoint, "_write_file", writer)


def test_disk_full_writing_a_checkpoint_then_resume(tmp_path, small_config, monkeypatch, through):
    run_dir = tmp_path / "run"
    full_disk_writer(monkeypatch, lambda p: p.parent.name == ".round_000004.partial" and p.name == "state.pt")
    proc = run_cli(["train", small_config, f"output.dir={run_dir}"])
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    written = run_dir / "checkpoints" / ".round_000004.partial" / "state.pt"
    assert f"disk full writing {written} (the filesystem at " in line and " free of " in line
    assert f"the last good checkpoint, {run_dir / 'checkpoints' / 'round_000002'}, is kept" in line
    assert f"continue with `distfl train --resume {run_dir}`" in line
    assert leftovers(run_dir) == []
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["latest", "round_000002"]
    failed = summary(run_dir)
    assert failed["status"] == "failed" and failed["error"].startswith("disk full writing")

    # A resume while the disk is still full: the same message, and nothing left behind.
    full_disk_writer(monkeypatch, lambda p: True)
    proc = run_cli(["train", "--resume", run_dir])
    assert proc.returncode == 1 and "disk full writing" in one_error_line(proc.stderr)
    assert leftovers(run_dir) == []

    monkeypatch.undo()
    resumed = train_ok(None, resume=str(run_dir))
    assert resumed["model_sha256"] == through["model_sha256"]
    assert resumed["status"] == "completed"


SITE_DISK_FULL = """
import errno, os
from pathlib import Path
if os.environ.get("RANK") == os.environ.get("DISK_FULL_RANK"):
    from distfl import checkpoint

    _write_file = checkpoint._write_file

    def write_file(data, path):
        if os.environ["DISK_FULL_AT"] in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        _write_file(data, path)

    checkpoint._write_file = write_file
"""


@pytest.mark.parametrize("rank,store,at", [("0", "disk", ".round_000004.partial/state.pt"),
                                           ("1", "memory", ".round_000004.partial/clients/")])
def test_disk_full_on_two_ranks_reports_once_and_resumes_exactly(tmp_path, small_config, rank, store, at):
    """SCAFFOLD: rank 0 cannot write the round-4 checkpoint's state.pt, or rank 1 its clients' files
    there (client state in memory: each rank writes its own). The rank whose next collective then
    breaks stays quiet. The resume on 2 ranks equals the uninterrupted run."""
    run_dir = tmp_path / "run"
    env = env_with_sitecustomize(tmp_path, SITE_DISK_FULL, DISK_FULL_RANK=rank, DISK_FULL_AT=at)
    args = ["algorithm.name=scaffold", f"runtime.client_state={store}"]
    proc = run_cli(["train", small_config, f"output.dir={run_dir}", *args], nproc=2, env=env)
    assert proc.returncode != 0
    line = one_error_line(proc.stderr)
    assert f"disk full writing {run_dir / 'checkpoints' / at.rstrip('/')}" in line
    assert f"the last good checkpoint, {run_dir / 'checkpoints' / 'round_000002'}, is kept" in line
    assert leftovers(run_dir) == []
    assert summary(run_dir)["status"] == "failed"
    reference = train_ok(small_config, f"output.dir={tmp_path / 'through'}", *args)
    resumed = train_ok(None, resume=str(run_dir), nproc=2)
    assert resumed["model_sha256"] == reference["model_sha256"]


def test_a_failed_resume_does_not_leave_completed_in_the_summary(tmp_path, small_config, monkeypatch):
    """A finished run continued to more rounds, whose checkpoints cannot be written (permission)."""
    run_dir = tmp_path / "run"
    train_ok(small_config, f"output.dir={run_dir}")
    from distfl import checkpoint

    write_file = checkpoint._write_file

    def refused(data, path):
        if ".partial" in str(path):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        write_file(data, path)

    monkeypatch.setattr(checkpoint, "_write_file", refused)
    proc = run_cli(["train", "--resume", run_dir, "train.rounds=8"])
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert line.startswith("distfl: error: writing checkpoint round_000008: PermissionError: [Errno 13]")
    failed = summary(run_dir)
    assert failed["status"] == "failed" and failed["error"] in line
    assert leftovers(run_dir) == []


def test_disk_full_in_the_client_state_store(tmp_path, small_config, monkeypatch):
    """SCAFFOLD's per-client state on disk: the store cannot write a client's file in round 3."""
    run_dir, args = tmp_path / "run", ["algorithm.name=scaffold", "runtime.client_state=disk"]
    reference = train_ok(small_config, f"output.dir={tmp_path / 'through'}", *args)
    written = []

    def failing(path):  # 5 clients a round: the 13th client-state file is written in round 3
        written.extend([path] if path.parent.name == "client_state" else [])
        return len(written) == 13 and path.parent.name == "client_state"

    full_disk_writer(monkeypatch, failing)
    proc = run_cli(["train", small_config, f"output.dir={run_dir}", *args])
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert f"disk full writing {written[-1].parent}/{written[-1].name.split('.')[1]}.pt (" in line
    assert f"the last good checkpoint, {run_dir / 'checkpoints' / 'round_000002'}, is kept" in line
    assert leftovers(run_dir) == []
    assert summary(run_dir)["status"] == "failed"
    monkeypatch.undo()
    assert train_ok(None, resume=str(run_dir))["model_sha256"] == reference["model_sha256"]


@pytest.fixture
def tmpfs(tmp_path):
    """A tmpfs (root only) of the size the test's `size` parameter says; raise it with remount."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# The sizes make the disk fill while writing, on this torch: config.yaml (4k), TensorBoard's events (8k),
# metrics.jsonl (12k), a checkpoint (120k).
@pytest.mark.parametrize("size", ["4k", "8k", "12k", "120k"])
def test_a_real_full_disk_ends_in_one_line_and_resumes_exactly(tmpfs, small_config, through, size):
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(tmpfs)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    run_dir = tmpfs / "run"
    args = ["checkpoint.every=1", "output.tensorboard=true"]
    proc = run_cli(["train", small_config, f"output.dir={run_dir}", *args])
    assert proc.returncode == 1, proc.stderr
    line = one_error_line(proc.stderr)
    assert line.startswith(f"distfl: error: disk full writing {run_dir}") and f" free of {size[:-1]}.0 KB" in line
    assert leftovers(run_dir) == []
    subprocess.run(["mount", "-o", "remount,size=20m", str(tmpfs)], check=True)
    if "run the same command again" in line:
        again = train_ok(small_config, f"output.dir={run_dir}", *args)
    else:
        assert f"continue with `distfl train --resume {run_dir}` (full traceback: " in line
        again = train_ok(None, *args, resume=str(run_dir))
    assert again["model_sha256"] == through["model_sha256"]


# ---- 3: any other error in a run -------------------------------------------------------------------------
def test_an_unexpected_error_is_one_line_with_its_traceback_saved(tmp_path, small_config, monkeypatch):
    from distfl.federation import round as engine

    train_client = engine.train_client

    def failing(worker, data, indices, runs, *rest):
        if runs[0].round_idx == 3:
            raise ValueError("a bug in a hook")
        return train_client(worker, data, indices, runs, *rest)

    monkeypatch.setattr(engine, "train_client", failing)
    run_dir = tmp_path / "run"
    proc = run_cli(["train", small_config, f"output.dir={run_dir}"])
    assert proc.returncode == 1
    line = one_error_line(proc.stderr)
    assert line.startswith("distfl: error: round 3, local training of client ")
    # The code that raised is outside distfl (this test's `failing`), so the line names it, as it would a plugin's.
    assert line.endswith(f": ValueError: a bug in a hook (in failing of {__file__}:{failing.__code__.co_firstlineno + 2}) "
                         f"(full traceback: {run_dir / 'error.log'})")
    log = (run_dir / "error.log").read_text()
    assert "Traceback (most recent call last)" in log and "raise ValueError" in log
    assert summary(run_dir)["status"] == "failed"

    proc = run_cli(["train", small_config, f"output.dir={tmp_path / 'debug'}", "--debug"])
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr
    monkeypatch.setenv("DISTFL_DEBUG", "1")
    proc = run_cli(["train", small_config, f"output.dir={tmp_path / 'debug_env'}"])
    assert proc.returncode == 1 and "Traceback (most recent call last)" in proc.stderr


SITE_BUG_ON_RANK_1 = """
import os
if os.environ.get("RANK") == "1":
    from distfl.federation import round as engine

    _train_client = engine.train_client

    def train_client(worker, data, indices, runs, *rest):
        if runs[0].round_idx == 2:
            raise ValueError("a bug on rank 1")
        return _train_client(worker, data, indices, runs, *rest)

    engine.train_client = train_client
"""


def test_a_failing_rank_reports_once(tmp_path, small_config):
    run_dir = tmp_path / "run"
    env = env_with_sitecustomize(tmp_path, SITE_BUG_ON_RANK_1)
    proc = run_cli(["train", small_config, f"output.dir={run_dir}"], nproc=2, env=env)
    assert proc.returncode != 0
    line = one_error_line(proc.stderr)
    assert line.startswith("distfl: error: rank 1, round 2, local training of client ")
    assert f"(full traceback: {run_dir / 'error.rank1.log'})" in line
    assert summary(run_dir)["status"] == "failed"


def _config_file(tmp_path, text):
    run_dir = tmp_path / "resumable"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(text)
    return run_dir


@pytest.mark.parametrize("case", ["a file", "under a file", "too long", "empty config", "bad config",
                                  ".lock a directory"])
def test_run_dir_faults_end_in_one_line(tmp_path, small_config, case):
    args = ["train", small_config]
    if case == "a file":
        (tmp_path / "out").write_text("x")
        args.append(f"output.dir={tmp_path / 'out'}")
        expected = "is a file, not a directory"
    elif case == "under a file":
        (tmp_path / "out").write_text("x")
        args.append(f"output.dir={tmp_path / 'out' / 'run'}")
        expected = f"is under {tmp_path / 'out'}, which is a file"
    elif case == "too long":
        args.append(f"output.dir={tmp_path / ('r' * 300)}")
        expected = "is too long for its filesystem"
    elif case == "empty config":
        args = ["train", "--resume", _config_file(tmp_path, "")]
        expected = "config.yaml is empty"
    elif case == "bad config":
        args = ["train", "--resume", _config_file(tmp_path, "seed: [1\n")]
        expected = "config.yaml: while parsing"
    else:
        (tmp_path / "run" / ".lock").mkdir(parents=True)
        args.append(f"output.dir={tmp_path / 'run'}")
        expected = "cannot be opened as a file (Is a directory)"
    proc = run_cli(args)
    assert proc.returncode == 2
    assert expected in one_error_line(proc.stderr)


def test_a_read_only_checkpoints_directory_is_refused_before_any_work(tmp_path, small_config):
    run_dir = tmp_path / "run"
    done = train_ok(small_config, f"output.dir={run_dir}")
    ckpts = run_dir / "checkpoints"
    if os.geteuid() != 0:
        ckpts.chmod(0o555)
    elif subprocess.run(["mount", "--bind", "-o", "ro", str(ckpts), str(ckpts)], capture_output=True).returncode:
        pytest.skip("a read-only bind mount needs root")
    try:
        proc = run_cli(["train", "--resume", run_dir, "train.rounds=8"])
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(ckpts)], capture_output=True)
        ckpts.chmod(0o755)
    assert proc.returncode == 2
    assert f"{ckpts} is read-only" in one_error_line(proc.stderr)
    assert summary(run_dir) == done  # nothing ran


# ---- 4: Ctrl-C --------------------------------------------------------------------------------------------
SITE_SLOW_ROUNDS = """
import os
if "SLOW_ROUNDS" in os.environ:
    import time
    from pathlib import Path
    from distfl.federation import runner

    _run_round = runner.Trainer.run_round

    def run_round(self, round_idx):
        if round_idx == 2 and os.environ.get("RANK", "0") == "0":
            Path(os.environ["SLOW_ROUNDS"]).touch()
        time.sleep(0.5)
        return _run_round(self, round_idx)

    runner.Trainer.run_round = run_round
"""


def _start(tmp_path, args, nproc=1):
    marker = tmp_path / "round2"
    env = env_with_sitecustomize(tmp_path, SITE_SLOW_ROUNDS, SLOW_ROUNDS=str(marker))
    launcher = [sys.executable, "-m", "distfl"] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", "-m", "distfl"]
    proc = subprocess.Popen([*launcher, *map(str, args)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate()
    return proc


@pytest.mark.parametrize("nproc", [1, 2])
def test_ctrl_c_checkpoints_and_resumes_exactly(tmp_path, small_config, through, nproc):
    """Ctrl-C in a terminal: SIGINT to every process of the foreground group (torchrun's launcher, which
    passes it on, and each rank)."""
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, ["train", small_config, f"output.dir={run_dir}", "checkpoint.every=0"], nproc=nproc)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and (nproc > 1 or proc.returncode == 3), err
    assert "checkpoint written after round 2" in err and f"distfl train --resume {run_dir}" in err
    assert [p.name for p in (run_dir / "checkpoints").glob("round_*")] == ["round_000002"]
    assert train_ok(None, resume=str(run_dir))["model_sha256"] == through["model_sha256"]


# ---- 5: torchrun's launcher killed -----------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGUSR1])
def test_ranks_stop_with_a_checkpoint_when_their_launcher_dies(tmp_path, small_config, through, sig):
    run_dir = tmp_path / "run"
    proc = _start(tmp_path, ["train", small_config, f"output.dir={run_dir}", "checkpoint.every=0"], nproc=2)
    os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=180)  # the pipes close when the ranks, which share them, exit
    assert "is gone: checkpointing after this round, then stopping" in err, err
    saved = [p.name for p in (run_dir / "checkpoints").glob("round_*")]
    assert len(saved) == 1 and saved[0] != "round_000006", err
    stopped = summary(run_dir)  # not finished, and why
    assert (stopped["status"], stopped["stopped_because"]) == ("stopped", "the death of its launcher (torchrun)")
    assert f"round_{stopped['round_reached']:06d}" == saved[0]
    assert train_ok(None, resume=str(run_dir))["model_sha256"] == through["model_sha256"]


# ---- 6, 7: runs without a `latest`, or without any checkpoint ------------------------------------------------
def test_sweep_resumes_a_run_with_checkpoints_but_no_latest(tmp_path, small_config):
    sweep_dir = tmp_path / "sweep"
    cfg = write_config(tmp_path / "sweep.yaml", output={"progress": "none", "tensorboard": False,
                                                         "dir": str(sweep_dir)})
    point = sweep_dir / "seed=0"
    train_ok(cfg, "seed=0", f"output.dir={point}", "train.rounds=4")
    (point / "summary.json").unlink()
    (point / "checkpoints" / "latest").unlink()
    proc = run_cli(["sweep", cfg, "--seeds", "0", "--dry-run"])
    assert proc.returncode == 0, proc.stderr
    assert "   resume  seed=0" in proc.stdout and f"--resume {point}" in proc.stdout
    assert "--overwrite" not in proc.stdout


def test_resume_before_the_first_checkpoint_starts_over(tmp_path, small_config, monkeypatch, through):
    from distfl.federation import runner

    run_round = runner.Trainer.run_round

    def killed_in_round_2(self, round_idx):
        if round_idx == 2:
            raise KeyboardInterrupt  # a second Ctrl-C: no checkpoint
        return run_round(self, round_idx)

    monkeypatch.setattr(runner.Trainer, "run_round", killed_in_round_2)
    run_dir = tmp_path / "run"
    assert run_cli(["train", small_config, f"output.dir={run_dir}"]).returncode == 130
    assert not (run_dir / "checkpoints" / "latest").exists() and (run_dir / "metrics.jsonl").exists()
    monkeypatch.undo()
    proc = run_cli(["train", "--resume", run_dir])
    assert proc.returncode == 0, proc.stderr
    assert "stopped before its first checkpoint, so there is nothing to resume: starting it over" in proc.stderr
    assert summary(run_dir)["model_sha256"] == through["model_sha256"]


def test_an_op_without_a_deterministic_kernel_mid_run_stays_a_config_error(tmp_path, small_config, monkeypatch):
    """dist.deterministic_ops names the op and runtime.deterministic; the fault handling keeps that."""
    from torch._prims_common import alert_not_deterministic

    from distfl.federation import round as engine

    train_client = engine.train_client

    def nondeterministic(worker, data, indices, runs, *rest):
        if runs[0].round_idx == 2:
            alert_not_deterministic("some_backward_cuda")
        return train_client(worker, data, indices, runs, *rest)

    monkeypatch.setattr(engine, "train_client", nondeterministic)
    proc = run_cli(["train", small_config, f"output.dir={tmp_path / 'run'}"])
    assert proc.returncode == 2
    assert "some_backward_cuda has no deterministic implementation" in one_error_line(proc.stderr)

"""Ranks whose launcher (torchrun) dies while they are still starting: they stop with one line, and a
relaunch on the same fixed port is neither joined nor blocked by them (distfl/launcher.py)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, env_with_sitecustomize, summary, train_ok

# Every rank of a launch with ORPHAN_MARKS set marks its pid; rank 0 then enters the process group's
# rendezvous, while rank 1 is held back before it (so rank 0 waits there on the launcher's store).
SITE_HOLD_AT_START = """
import os
if "RANK" in os.environ and "ORPHAN_MARKS" in os.environ:
    import time
    from pathlib import Path
    import torch.distributed as torch_dist

    _init = torch_dist.init_process_group

    def init_process_group(*args, **kwargs):
        (Path(os.environ["ORPHAN_MARKS"]) / f"rank{os.environ['RANK']}.{os.getpid()}").touch()
        if os.environ["RANK"] != "0":
            time.sleep(600)
        return _init(*args, **kwargs)

    torch_dist.init_process_group = init_process_group
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


def torchrun(port: int, *args) -> list[str]:
    """torchrun on a fixed port (no --standalone): a relaunch listens where the old launcher did."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
            "--master_addr=127.0.0.1", f"--master_port={port}", "-m", "distfl", *map(str, args)]


def test_ranks_orphaned_at_start_up_stop_and_never_meet_the_relaunch(tmp_path, small_config):
    """The issue's repro, on a fixed port: kill -9 of torchrun while rank 0 waits in the rendezvous and
    rank 1 has not reached it, relaunch at once with --overwrite on the same port: the relaunch trains
    the run (2 ranks, the same model as 1 rank), and the old ranks each stopped with one line."""
    port, marks, run_dir = free_port(), tmp_path / "marks", tmp_path / "run"
    marks.mkdir()
    env = env_with_sitecustomize(tmp_path, SITE_HOLD_AT_START, ORPHAN_MARKS=str(marks))
    args = ["train", small_config, f"output.dir={run_dir}"]
    first = subprocess.Popen(torchrun(port, *args), cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 240  # a guard against a hang, not a measured bound
    while len(list(marks.iterdir())) < 2 and time.time() < deadline and first.poll() is None:
        time.sleep(0.05)
    pids = sorted(int(p.name.partition(".")[2]) for p in marks.iterdir())
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    try:
        assert len(pids) == 2, first.communicate()
        relaunch_and_check(tmp_path, small_config, first, pids, torchrun(port, *args, "--overwrite"), env)
    finally:
        for pid in pids:  # a failing test leaves no orphan behind
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def relaunch_and_check(tmp_path, small_config, first, pids, command, env):
    env.pop("ORPHAN_MARKS")
    relaunch = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    run_dir = tmp_path / "run"
    assert relaunch.returncode == 0, relaunch.stderr
    assert "in use by another distfl run" not in relaunch.stderr
    assert not any(alive(pid) for pid in pids)
    _, err = first.communicate(timeout=120)  # the old ranks share the pipes; these close as they exit
    lines = [line for line in err.splitlines() if "is gone during start-up" in line]
    assert sorted(line.split(":")[1] for line in lines) == [" rank 0", " rank 1"], err
    assert "this launch wrote no checkpoint" in lines[0]
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}")
    assert summary(run_dir)["model_sha256"] == one["model_sha256"]
    assert summary(run_dir)["world_size"] == 2


# A process that takes RUN_DIR's lock as rank 0 of a torchrun launch would, recording LAUNCHER as its
# launcher, then holds it until its stdin closes.
HOLDER = """
import sys
from distfl import checkpoint, launcher
launcher.LAUNCHER = int(sys.argv[2])
lock = checkpoint.lock_run_dir(sys.argv[1])
print("locked", flush=True)
sys.stdin.read()
"""


def hold_lock(run_dir: Path, launcher_pid: int) -> subprocess.Popen:
    run_dir.mkdir(exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir), str(launcher_pid)], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "locked\n"
    return proc


def test_a_run_waits_for_a_lock_held_by_an_orphaned_rank_and_refuses_a_live_one(tmp_path, capsys):
    """The lock names its holder's launcher: a holder that outlived it (its parent is another process)
    stops within launcher.GRACE_S, so a new run waits for it; a holder whose launcher lives refuses."""
    import threading

    from distfl import checkpoint
    from distfl.errors import CheckpointError

    run_dir = tmp_path / "run"
    live = hold_lock(run_dir, os.getpid())  # its parent is this process: its launcher lives
    with pytest.raises(CheckpointError, match="in use by another distfl run"):
        checkpoint.lock_run_dir(run_dir)
    live.communicate("")
    orphan = hold_lock(run_dir, os.getppid())  # its launcher, by the lock file, is not its parent
    stopped = threading.Event()

    def stop():  # a moment later, it stops, as an orphan does
        stopped.set()
        orphan.communicate("")

    threading.Timer(2.0, stop).start()
    lock = checkpoint.lock_run_dir(run_dir)
    assert stopped.is_set()
    assert f"is held by rank 0 (pid {orphan.pid}) of an earlier launch whose launcher is gone" in capsys.readouterr().err
    lock.close()


def test_ranks_orphaned_in_a_long_round_stop_within_the_grace_and_the_relaunch_waits_for_them(tmp_path, small_config):
    """torchrun killed while both ranks are in a 40 s round 1, longer than launcher.GRACE_S: each rank
    stops after the grace with one line; a relaunch at once on the same port finds rank 0's lock held
    by an orphan, waits for it instead of refusing, and trains the run to the same model as 1 rank."""
    from conftest import slow_first_round, wait_for_marks

    port, run_dir = free_port(), tmp_path / "run"
    env, marks = slow_first_round(tmp_path)
    args = ["train", small_config, f"output.dir={run_dir}"]
    first = subprocess.Popen(torchrun(port, *args), cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for_marks(marks, 2)
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    env.pop("SLOW_ROUND_MARKS")
    relaunch = subprocess.run(torchrun(port, "train", "--resume", run_dir), cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)
    _, err = first.communicate(timeout=120)
    assert relaunch.returncode == 0, relaunch.stderr
    assert "of an earlier launch whose launcher is gone; it stops within 30s: waiting for it" in relaunch.stderr
    lines = [line for line in err.splitlines() if "has been gone 30s and this rank has not finished its round" in line]
    assert sorted(line.split(":")[1] for line in lines) == [" rank 0", " rank 1"], err
    one = train_ok(small_config, f"output.dir={tmp_path / 'one'}")
    assert summary(run_dir)["model_sha256"] == one["model_sha256"]


TIMEOUTS = """
import torch
import torch.distributed.distributed_c10d as c10d
from distfl import dist
ctx = dist.init("cpu")
backend = c10d._get_default_group()._get_backend(torch.device("cpu"))
with open(f"{__import__('sys').argv[1]}/rank{ctx.rank}.txt", "w") as out:  # two ranks' stdout would interleave
    out.write(f"{c10d._get_default_store().timeout.total_seconds()} {backend.options._timeout.total_seconds()}")
dist.shutdown(ctx)
"""


def test_the_rendezvous_is_bounded_apart_from_the_collectives(tmp_path):
    """Two real ranks: the store of the rendezvous waits dist.RENDEZVOUS_TIMEOUT (10 min) for a rank that
    never comes, while each collective keeps dist.COLLECTIVE_TIMEOUT (30 min) for a slow peer."""
    (tmp_path / "timeouts.py").write_text(TIMEOUTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(tmp_path / "timeouts.py"), str(tmp_path)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["600.0 1800.0"] * 2

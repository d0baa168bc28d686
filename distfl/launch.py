"""`distfl train --nproc N` (and `distfl sweep --nproc N`): distfl starts torchrun for the ranks and
answers the signals itself, so that a stop ends as docs/faults.md says: one checkpoint, one line,
exit status 3, and no launcher traceback.

torchrun runs in a session of its own, so a Ctrl-C in the terminal reaches only this process; this
process asks each rank for a checkpoint after the current round (SIGUSR1, as Slurm preemption does).
Not torchrun: its agent answers SIGINT and SIGTERM by raising an exception that ends it with a
traceback and status 1, and kills the ranks 30 s later, which loses the checkpoint of a longer round.
The ranks, told through DISTFL_LAUNCHER that this process reports the stop, write that they stopped
into the file DISTFL_STOPPED names and exit 0 after their checkpoint, so torchrun ends quietly; this
process then exits 3, whoever was signalled (this process, or one rank: a kill, a preempted node). A
second Ctrl-C stops every process at once, without a checkpoint (status 130), as it does for a run
without torchrun.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

# Set for the ranks: a stop that checkpointed exits 0 there, and this launcher exits 3.
LAUNCHER_ENV = "DISTFL_LAUNCHER"
# Set for the ranks: the file a rank that stopped before the last round writes (`report_stop`).
STOPPED_ENV = "DISTFL_STOPPED"
# The directory that holds this distfl: torchrun's ranks import it from there.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])


def torchrun_command(nproc: int, distfl_args: list[str]) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "distfl", *distfl_args]


def child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    env[LAUNCHER_ENV] = "distfl"
    return env


def report_stop() -> bool:
    """In a rank of `distfl train --nproc`: tell the launcher that the run stopped before its last round
    (its exit status is then 3). False when there is no such launcher or it cannot be told: the rank
    then exits 3 itself."""
    path = os.environ.get(STOPPED_ENV)
    if os.environ.get(LAUNCHER_ENV) != "distfl" or not path:
        return False
    try:
        with open(path, "a") as f:
            f.write(f"rank {os.environ.get('RANK', '?')}\n")
        return True
    except OSError:
        return False


def run_ranks(cmd: list[str]) -> int:
    """Run torchrun `cmd`; 0 when the run finished, 3 when a signal stopped it after a checkpoint,
    130 after a second Ctrl-C, else torchrun's status."""
    with tempfile.TemporaryDirectory(prefix="distfl-launch-") as folder:
        stopped = Path(folder) / "stopped"
        code, signalled = _wait_for_ranks(cmd, {**child_env(), STOPPED_ENV: str(stopped)})
        if "kill" in signalled:
            return 130
        # The ranks' word, not whether this process was signalled: a signal to one rank stops the run
        # too, and a run whose last round was under way when the signal came finished.
        return 3 if code == 0 and stopped.exists() else code


def _wait_for_ranks(cmd: list[str], env: dict) -> tuple[int, list]:
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    signalled = []

    def forward(signum, frame):
        if signum == signal.SIGINT and signal.SIGINT in signalled:  # a second Ctrl-C: now
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            signalled.append("kill")
            return
        signalled.append(signum)
        for rank in children(proc.pid):
            try:
                os.kill(rank, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    with signals_handled_by(forward, (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)):
        code = proc.wait()
    return code, signalled


def children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc), those of every thread."""
    pids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread or the process has ended
            pass
    return pids


@contextmanager
def signals_handled_by(handler, signals):
    """`handler` for `signals` inside the block; the handlers from before it again after it."""
    previous = {sig: signal.signal(sig, handler) for sig in signals}
    try:
        yield
    finally:
        for sig, earlier in previous.items():
            signal.signal(sig, earlier)

"""`--executor local`: the points run here one after another, in this process (one rank) or under
torchrun (--nproc > 1), skipping those that finished; a SIGTERM/SIGUSR1 checkpoints the current one."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ..errors import DistflError, Interrupted
from ..logging import clock, result_lines
from .plan import Point, Sweep
from .inprocess import PACKAGE_ROOT, signals_handled_by, stop_signals, train_in_process
from .state import final_report, runs_text, train_args


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def local_command(sweep: Sweep, point: Point) -> list[str]:
    """The `distfl train` command line (under torchrun for nproc > 1) that runs `point` here."""
    fixed = [o for o in sweep.fixed if not o.startswith("output.dir=")]  # the point's own comes last
    if sweep.nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={sweep.nproc}"]
    else:
        launcher = [sys.executable]
    return [*launcher, "-m", "distfl", "train", *train_args(point.run_dir, point.config, point.state,
                                                              sweep.config_path, [*fixed, *point.overrides])]


def run_local(sweep: Sweep, out=None) -> int:
    """Run the points here one after another; 0 when all finished, 3 when stopped by a signal, 1 else."""
    out = out or sys.stdout
    failed = []
    todo = sweep.todo
    print(f"distfl sweep: {runs_text(sweep)}; running {len(todo)} here, {sweep.nproc} rank(s) each",
          file=out, flush=True)
    started = time.monotonic()
    for i, point in enumerate(todo, 1):
        verb = "resuming" if point.state == "resume" else "running"
        print(f"[{i}/{len(todo)}] {verb} {point.name}{_eta(started, i - 1, len(todo))}", file=out, flush=True)
        if sweep.nproc == 1:
            code = _run_point_in_process(point, out)
        else:
            code = _run_point_subprocess(local_command(sweep, point), out)
        if code == 3:
            print(f"distfl sweep: stopped by a signal during {point.name} (checkpointed); run the same "
                  "command again to continue", file=out, flush=True)
            return 3
        if code == 130:
            return 130
        if code != 0:
            failed.append(point.name)
    return final_report(sweep, out, failed)


def _eta(started: float, done: int, total: int) -> str:
    """", sweep eta 12m30s": the time the remaining points take at the mean pace of those run so far in
    this invocation (a point's rounds, not the sweep's; points of different sizes make it rough)."""
    if done == 0:
        return ""
    return f" (sweep eta {clock((time.monotonic() - started) / done * (total - done))})"


def _run_point_in_process(point: Point, out) -> int:
    with stop_signals() as stop:
        try:
            summary = train_in_process(point.config, point.state, stop)
            print("\n".join(f"  {line}" for line in result_lines(summary, point.run_dir)), file=out, flush=True)
            return 0
        except Interrupted:
            return 3
        except DistflError as exc:
            print(f"  failed: {exc}", file=out, flush=True)
            return 1
        except KeyboardInterrupt:
            return 130


def _run_point_subprocess(cmd: list[str], out) -> int:
    """Run one point under torchrun; a SIGTERM/SIGUSR1 to the sweep becomes a SIGUSR1 to each rank.
    Not to torchrun: its agent answers a SIGTERM by killing the ranks 30 s later, which loses the
    checkpoint of a longer round (and a SIGUSR1 would end torchrun itself)."""
    proc = subprocess.Popen(cmd, env=_child_env())
    signalled = []

    def forward(signum, frame):
        signalled.append(signum)
        for rank in _children(proc.pid):
            try:
                os.kill(rank, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    with signals_handled_by(forward, (signal.SIGTERM, signal.SIGUSR1)):
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the ranks got the SIGINT too; let them finish dying
            proc.wait()
            return 130
        # The ranks exit 3 after the checkpoint; torchrun reports any rank's non-zero exit as 1.
        return 3 if signalled and code != 0 else code


def _children(pid: int) -> list[int]:
    """The child processes of `pid` (Linux /proc), those of every thread."""
    pids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # the thread or the process has ended
            pass
    return pids

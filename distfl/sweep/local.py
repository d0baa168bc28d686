"""`--executor local`: the points run here one after another, in this process (one rank) or under
torchrun (--nproc > 1, started and signalled by distfl.launch), skipping those that finished; a
SIGTERM/SIGUSR1 (and under --nproc > 1 a Ctrl-C) checkpoints the current one."""
from __future__ import annotations

import sys
import time

from ..errors import DistflError, Interrupted
from ..launch import run_ranks, torchrun_command
from ..logging import clock, result_lines
from .plan import Point, Sweep
from .inprocess import stop_signals, train_in_process
from .state import final_report, runs_text, train_args


def local_command(sweep: Sweep, point: Point) -> list[str]:
    """The `distfl train` command line (under torchrun for nproc > 1) that runs `point` here."""
    fixed = [o for o in sweep.fixed if not o.startswith("output.dir=")]  # the point's own comes last
    args = train_args(point.run_dir, point.config, point.state, sweep.config_path, [*fixed, *point.overrides])
    if sweep.nproc > 1:
        return torchrun_command(sweep.nproc, ["train", *args])
    return [sys.executable, "-m", "distfl", "train", *args]


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
            code = run_ranks(local_command(sweep, point))
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
        except Interrupted as exc:
            print(f"  {exc}", file=out, flush=True)
            return 3
        except DistflError as exc:
            print(f"  failed: {exc}", file=out, flush=True)
            return 1
        except KeyboardInterrupt:
            return 130

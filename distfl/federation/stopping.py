"""Stopping a run cleanly: SIGTERM / SIGUSR1 (Slurm preemption, time limits) and Ctrl-C ask for a
checkpoint after the current round; a torchrun worker whose launcher died does the same.

A run stopped before its last round never looks finished: one line names why and the command that
continues it, summary.json says `"status": "stopped"` with `stopped_because` and `round_reached`, and
the exit status is 3 (docs/faults.md)."""
from __future__ import annotations

import os
import signal
import threading
from typing import Callable

from .. import launcher

# Why a run stops before its last round (StopFlags.reason indexes it), as the stop line and summary.json's
# `stopped_because` say it.
REASONS = ("SIGTERM (a kill, or Slurm's preemption, requeue or cancel)",
           "SIGUSR1 (Slurm's warning signal, or `distfl train --nproc` passing on a Ctrl-C or SIGTERM)",
           "Ctrl-C (SIGINT)",
           "the death of its launcher (torchrun)",
           "SIGUSR2 (the sweep's Slurm job reached its time limit)")
SIGNAL_REASON = {signal.SIGTERM: 0, signal.SIGUSR1: 1, signal.SIGINT: 2, signal.SIGUSR2: 4}
LAUNCHER_GONE = 3
# The round's "stop" sum carries each rank's reason as a count in a field of this many bits (4095 ranks
# a reason), so that rank 0 names the reason even when the signal reached only another rank.
FIELD_BITS = 12


def stop_code(stop) -> int:
    """What this rank adds to the round's "stop" segment: 0, or one count in its reason's field."""
    if not stop.requested:
        return 0
    return 1 << (FIELD_BITS * (stop.reason if stop.reason is not None else 0))


def agree(stop, total: int) -> None:
    """The round's summed "stop" codes: every rank stops after this round if any asked, and knows why."""
    stop.agreed = total > 0
    if stop.agreed:
        stop.reasons = [why for i, why in enumerate(REASONS) if (total >> (FIELD_BITS * i)) & ((1 << FIELD_BITS) - 1)]


def resume_command(run_dir, world_size: int) -> str:
    """The command that continues the run in `run_dir` from its last checkpoint, launched as this one was."""
    train = f"distfl train --resume {run_dir}"
    if os.environ.get("DISTFL_LAUNCHER") == "distfl":  # launch.LAUNCHER_ENV: `distfl train --nproc N`
        return f"{train} --nproc {world_size}"
    if "TORCHELASTIC_RUN_ID" in os.environ:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        if local == world_size:
            return f"torchrun --standalone --nproc_per_node={world_size} -m {train}"
        return (f"torchrun --nnodes={world_size // local} --nproc_per_node={local} (with this job's rendezvous "
                f"flags) -m {train}")
    if world_size == 1:
        return train
    return f"the same launch command (srun) with {train}"


def stopped_line(stop, where: str, run_dir, world_size: int) -> str:
    """The one line of a run that a stop signal ended after `where` (e.g. "round 41 of 200"), checkpointed."""
    why = " and ".join(stop.reasons) or "a stop signal"
    return (f"stopped by {why} before the last round: checkpoint written after {where}; the run is not finished "
            f"(summary.json: \"status\": \"stopped\"); continue with `{resume_command(run_dir, world_size)}`")


class StoppedAtOnce(KeyboardInterrupt):
    """A second Ctrl-C: the run stops at once, without a checkpoint of the round in progress."""

    def __init__(self, run_dir):
        super().__init__(str(run_dir))
        self.run_dir = run_dir


def interrupted_line(exc: KeyboardInterrupt) -> str:
    """What `distfl train` prints when Ctrl-C ends it at once (exit status 130)."""
    from ..checkpoint import checkpoints_dir
    from ..faults import latest_checkpoint

    run_dir = getattr(exc, "run_dir", None)
    if run_dir is None:
        return "interrupted (Ctrl-C)"
    latest = latest_checkpoint(run_dir)
    then = (f"`distfl train --resume {run_dir}` continues from its last checkpoint, {checkpoints_dir(run_dir) / latest}"
            if latest else f"it has no checkpoint yet: `distfl train --resume {run_dir}` starts it over")
    return f"stopped at once by a second Ctrl-C, without a checkpoint of the round in progress; {then}"


def catch_stop_signals(stop, request: Callable[[int], None], run_dir) -> dict:
    """SIGTERM / SIGUSR1 (Slurm preemption, time limits) and SIGINT (Ctrl-C) ask for a checkpoint at
    the end of the round (`request(reason)`, which sets `stop.requested`: run_state.StopFlags); a second
    Ctrl-C stops at once, without one. Returns the handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_signal(signum, frame):
        # Not under torchrun: a Ctrl-C there reaches each rank twice (from the terminal, and passed
        # on by the launcher), and only the launcher is to answer a second one.
        if signum == signal.SIGINT and stop.requested and stop.interrupts and stop.launcher is None:
            raise StoppedAtOnce(run_dir)
        stop.interrupts += signum == signal.SIGINT
        request(SIGNAL_REASON[signum])

    # torchrun's workers: the launcher that started them (recorded when distfl was imported). SIGKILL,
    # or a signal torchrun does not handle (SIGUSR1: its default action kills it), ends it without
    # stopping them; from here on they notice at the next round boundary and stop as on SIGTERM
    # (before here, distfl/launcher.py stops them at once).
    stop.launcher = launcher.LAUNCHER
    launcher.training()
    return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}


def check_launcher(stop, request: Callable[[int], None], logger) -> None:
    """At a round boundary: a worker whose launcher died checkpoints and stops after this round."""
    if stop.launcher is not None and launcher.gone() and not stop.requested:
        logger.info(f"the launcher (torchrun, pid {stop.launcher}) is gone: checkpointing after this round, "
                    "then stopping")
        request(LAUNCHER_GONE)

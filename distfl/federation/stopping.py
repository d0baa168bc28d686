"""Stopping a run cleanly: SIGTERM / SIGUSR1 (Slurm preemption, time limits) and Ctrl-C ask for a
checkpoint after the current round; a torchrun worker whose launcher died does the same."""
from __future__ import annotations

import signal
import threading
from typing import Callable

from .. import launcher


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


def catch_stop_signals(stop, request: Callable[[], None], run_dir) -> dict:
    """SIGTERM / SIGUSR1 (Slurm preemption, time limits) and SIGINT (Ctrl-C) ask for a checkpoint at
    the end of the round (`request()`, which sets `stop.requested`: run_state.StopFlags); a second
    Ctrl-C stops at once, without one. Returns the handlers it replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_signal(signum, frame):
        # Not under torchrun: a Ctrl-C there reaches each rank twice (from the terminal, and passed
        # on by the launcher), and only the launcher is to answer a second one.
        if signum == signal.SIGINT and stop.requested and stop.interrupts and stop.launcher is None:
            raise StoppedAtOnce(run_dir)
        stop.interrupts += signum == signal.SIGINT
        request()

    # torchrun's workers: the launcher that started them (recorded when distfl was imported). SIGKILL,
    # or a signal torchrun does not handle (SIGUSR1: its default action kills it), ends it without
    # stopping them; from here on they notice at the next round boundary and stop as on SIGTERM
    # (before here, distfl/launcher.py stops them at once).
    stop.launcher = launcher.LAUNCHER
    launcher.training()
    return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}


def check_launcher(stop, request: Callable[[], None], logger) -> None:
    """At a round boundary: a worker whose launcher died checkpoints and stops after this round."""
    if stop.launcher is not None and launcher.gone() and not stop.requested:
        logger.info(f"the launcher (torchrun, pid {stop.launcher}) is gone: checkpointing after this round, "
                    "then stopping")
        request()

"""Stopping a run cleanly: SIGTERM / SIGUSR1 (Slurm preemption, time limits) and Ctrl-C ask for a
checkpoint after the current round; a torchrun worker whose launcher died does the same. Both set the
run's stop flags (federation/run_state.py StopFlags), which the next round's all_reduce agrees on."""
from __future__ import annotations

import os
import signal
import threading


def catch_stop_signals(stop) -> dict:
    """SIGTERM / SIGUSR1 (Slurm preemption, time limits) and SIGINT (Ctrl-C) ask for a checkpoint at
    the end of the round; a second Ctrl-C stops at once, without one."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def on_signal(signum, frame):
        # Not under torchrun: a Ctrl-C there reaches each rank twice (from the terminal, and passed
        # on by the launcher), and only the launcher is to answer a second one.
        if signum == signal.SIGINT and stop.requested and stop.interrupts and stop.launcher is None:
            raise KeyboardInterrupt
        stop.interrupts += signum == signal.SIGINT
        stop.requested = True

    # torchrun's workers: the launcher that started them. SIGKILL, or a signal torchrun does not
    # handle (SIGUSR1: its default action kills it), ends it without stopping them; they notice
    # their new parent at the next round boundary and stop as on SIGTERM.
    stop.launcher = os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None
    return {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}

def check_launcher(stop, logger) -> None:
    """At a round boundary: a worker whose launcher died checkpoints and stops after this round."""
    if stop.launcher is not None and os.getppid() != stop.launcher and not stop.requested:
        logger.info(f"the launcher (torchrun, pid {stop.launcher}) is gone: checkpointing after this round, "
                    "then stopping")
        stop.requested = True

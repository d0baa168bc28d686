"""One point trained in this process (a local one-rank run, or one task of a Slurm job), stopped at a
round boundary by the signals of preemption, requeue, cancel and time limits."""
from __future__ import annotations

import signal
from contextlib import contextmanager
from pathlib import Path

from ..federation.stopping import SIGNAL_REASON
from ..launch import signals_handled_by


def train_in_process(config: dict, state: str, stop: dict) -> dict:
    """Train one point in this process (one rank: alone, or one Slurm task). `stop` is shared with the
    signal handlers of `stop_signals`: a signal before the rounds start is passed to the trainer."""
    from .. import dist
    from ..config import config_from_dict
    from ..federation.runner import Trainer

    cfg = config_from_dict(config, source=str(Path(config["output"]["dir"]) / "config.yaml"))
    ctx = dist.init(cfg.runtime.device, cfg.runtime.threads, cfg.runtime.deterministic, cfg.runtime.tf32)
    try:
        with dist.deterministic_ops():
            trainer = Trainer(cfg, ctx, resume=state == "resume", overwrite=state == "overwrite")
            stop["trainer"] = trainer
            if stop["signal"] is not None:  # agreed with the other ranks after the first round
                trainer.request_stop(SIGNAL_REASON[stop["signal"]])
            return trainer.run()
    finally:
        if stop["trainer"] is not None:
            stop["trainer"].close()  # release the run directory's lock now, not when collected
        stop["trainer"] = None
        dist.shutdown(ctx)


@contextmanager
def stop_signals():
    """Yields the `stop` state for `train_in_process`. Inside the block, until the trainer installs its
    own handlers (and after), SIGTERM/SIGUSR1 (preemption, requeue, cancel) and SIGUSR2 (submitit's
    time-limit warning) ask for a checkpoint at the next round boundary. SIGUSR2 stays ours during
    training (the trainer handles SIGTERM/SIGUSR1 only) and marks the stop as a time limit, after which
    the job requeues itself."""
    stop = {"trainer": None, "signal": None, "timeout": False}

    def handler(signum, frame):
        stop["signal"] = signum
        if signum == signal.SIGUSR2:
            stop["timeout"] = True
        if stop["trainer"] is not None:
            stop["trainer"].request_stop(SIGNAL_REASON[signum])

    with signals_handled_by(handler, (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)):
        yield stop

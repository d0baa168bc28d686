"""One point trained in this process (a local one-rank run, or one task of a Slurm job), stopped at a
round boundary by the signals of preemption, requeue, cancel and time limits."""
from __future__ import annotations

import signal
from pathlib import Path

# The directory that holds this distfl: child processes and Slurm tasks import it from there.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def train_in_process(config: dict, state: str, stop: dict) -> dict:
    """Train one point in this process (one rank: alone, or one Slurm task). `stop` is shared with the
    signal handlers of `catch_signals`: a signal before the rounds start is passed to the trainer."""
    from .. import dist
    from ..config import config_from_dict
    from ..federation.runner import Trainer

    cfg = config_from_dict(config, source=str(Path(config["output"]["dir"]) / "config.yaml"))
    ctx = dist.init(cfg.runtime.device, cfg.runtime.threads, cfg.runtime.deterministic)
    try:
        with dist.deterministic_ops():
            trainer = Trainer(cfg, ctx, resume=state == "resume", overwrite=state == "overwrite")
            stop["trainer"] = trainer
            if stop["signal"] is not None:
                trainer.request_stop()  # agreed with the other ranks after the first round
            return trainer.run()
    finally:
        if stop["trainer"] is not None:
            stop["trainer"].close()  # release the run directory's lock now, not when collected
        stop["trainer"] = None
        dist.shutdown(ctx)


def catch_signals(stop: dict) -> dict:
    """Until the trainer installs its own handlers (and after), SIGTERM/SIGUSR1 (preemption, requeue,
    cancel) and SIGUSR2 (submitit's time-limit warning) ask for a checkpoint at the next round
    boundary. SIGUSR2 stays ours during training (the trainer handles SIGTERM/SIGUSR1 only) and marks
    the stop as a time limit, after which the job requeues itself."""
    def handler(signum, frame):
        stop["signal"] = signum
        if signum == signal.SIGUSR2:
            stop["timeout"] = True
        if stop["trainer"] is not None:
            stop["trainer"].request_stop()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}

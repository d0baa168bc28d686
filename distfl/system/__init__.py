"""System heterogeneity on a virtual clock (docs/system.md): client speeds, bandwidths, availability and
dropouts (model.py, traces.py), synchronous rounds with deadlines and over-selection (clock.py), and
asynchronous FedBuff / FedAsync (asynchronous.py, staleness.py); handle.py is what the runner holds.

The runner holds one `System` (None while every `system.*` key has its default: today's rounds, bit for
bit) and calls it at three places: the round's plan (who trains, with how many steps), the checkpoint's
state, and (async) the whole server step. Importing this package (config validation does, through
rules.py) loads neither torch nor the trainer.
"""
from __future__ import annotations


def enabled(cfg) -> bool:
    """Whether the run uses the system model: some system.* key differs from its default."""
    return cfg.system != type(cfg.system)()


def build(trainer):
    """The run's System (after the trainer's algorithm and pack size are set), or None."""
    if not enabled(trainer.cfg):
        return None
    from .handle import System

    system = System(trainer)
    system.check_runtime(trainer.pack_size)
    return system

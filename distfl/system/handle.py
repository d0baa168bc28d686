"""The runner's handle on the virtual clock: the system model, the synchronous clock or the asynchronous
engine, and the round's plan (see the package's docstring)."""
from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from ..federation.local import batch_sizes
from .clock import RoundPlan, SyncClock
from .model import SystemModel


class System:
    """The runner's handle: the system model, the clock, and the round's plan."""

    def __init__(self, trainer):
        cfg = trainer.cfg
        self.cfg = cfg
        self.trainer = trainer
        worker = trainer.worker
        self.compute_scale = forward_flops(worker.module, trainer.data.train_x[:1]) / cfg.system.reference_flops \
            if cfg.system.reference_flops > 0 else 1.0
        self.model = SystemModel(cfg, len(trainer.population), *trainer.payload_bytes(), self.compute_scale)
        self.clock = SyncClock(self.model, trainer.population, cfg)
        self.asynchronous = cfg.system.async_mode != "none"
        self.plan: RoundPlan | None = None
        self.engine = None
        if self.asynchronous:
            from .asynchronous import AsyncEngine

            self.engine = AsyncEngine(self)

    def check_runtime(self, pack_size: int) -> None:
        s = self.cfg.system
        if self.asynchronous and pack_size > 1:
            raise ConfigError(f"system.async_mode={s.async_mode} trains each client from the model version it started "
                              f"from; runtime.pack_size={pack_size} trains a pack from one model: set runtime.pack_size=1")
        own = self.trainer.algorithm.overrides("local_training")
        cut = s.round in ("deadline", "stragglers") and s.partial_work
        if cut and own:
            raise ConfigError(f"system.partial_work cuts a late client's local steps; algorithm.name={self.cfg.algorithm.name} "
                              "trains in passes of its own (local_training), which have no such cut: set "
                              "system.partial_work=false")
        if cut and pack_size > 1:
            raise ConfigError(f"system.partial_work trains late clients for fewer steps than the rest of their pack; "
                              f"runtime.pack_size={pack_size} trains a pack in lockstep: set runtime.pack_size=1")

    def steps(self, client: int) -> list[int]:
        """The samples each local step of `client` covers in a whole round (the method's own passes,
        local_training, count as one step of all their samples)."""
        t = self.trainer
        train = self.cfg.train
        n = int(t.population.sizes[client])
        if t.algorithm.overrides("local_training"):
            return [t.algorithm.local_samples(n, train)]
        return batch_sizes(n, train.batch_size, train.local_epochs, train.local_steps, t.worker.fold_single)

    def plan_round(self, round_idx: int) -> RoundPlan:
        self.plan = self.clock.plan(round_idx, self.steps)
        return self.plan

    def train_cfg(self, client: int, train):
        """train.* for `client` this round: its partial work's steps if it was late (partial_work)."""
        done = self.plan.partial_steps.get(client) if self.plan is not None else None
        return train if done is None else dataclasses.replace(train, local_epochs=1, local_steps=done)

    def run_async(self, step: int) -> dict:
        """One asynchronous server step (asynchronous.py), its metrics row."""
        return self.engine.run_async(step)

    @property
    def now_s(self) -> float:
        return self.engine.now_s if self.engine is not None else self.clock.now_s

    def state_dict(self) -> dict:
        state = {"clock": self.clock.state_dict()}
        if self.engine is not None:
            state["async"] = self.engine.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        self.clock.load_state_dict(state["clock"])
        if self.engine is not None:
            self.engine.load_state_dict(state["async"])


def forward_flops(module, sample) -> int:
    """FLOPs of one forward pass of `module` on `sample` (a batch of one), by torch's FlopCounterMode."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            module(sample)
    finally:
        module.train(was_training)
    return int(counter.get_total_flops())


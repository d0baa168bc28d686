"""Synchronous rounds on a virtual clock: who is sampled, who finishes, who is late or drops out, and how
long the round takes, as a pure function of (seed, round, the clock at the round's start, the system
model, the config). Every rank computes the same plan; only the clock's value is carried between rounds
(and checkpointed).

A round that starts at virtual time T:
  1. sampling: train.clients_per_round clients (round=overselect: ceil(overselect x that)) by the run's
     cohort rule; under an availability model with unavailable=skip, a keyed sample of the clients
     online at T instead (if none is, the round first waits until one comes online, and T is then);
  2. each sampled client c takes d_c = download + compute(samples it trains) + upload seconds; it drops
     out if its keyed dropout draw says so, if it was offline at T (unavailable=fail), or if it is
     offline at T + d_c (it left before reporting: FedScale's rule);
  3. wait_all: every client that did not drop is kept, and the round lasts max d_c over them;
     deadline: clients with d_c <= deadline_s are kept, the others are late: dropped, or (partial_work)
     kept with the local steps they finished by the deadline; the round lasts min(deadline_s, max d_c);
     overselect: the first clients_per_round to finish (by d_c, then id) are kept, the others are late;
     the round lasts until the last kept one reports;
     stragglers (FedProx's model): the stragglers the system model draws among the sampled manage e_c of
     the train.local_epochs epochs: they are late and dropped, or (partial_work) kept with the steps of
     those e_c epochs; the round lasts until the last kept one reports (its d_c for the work it does).
A client that dropped is assumed to be noticed when it disconnects (it does not hold a round open).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .model import COHORT, SystemModel


@dataclass
class RoundPlan:
    round_idx: int
    start_s: float
    sampled: list[int]
    kept: list[int]  # the clients whose updates are aggregated, sorted
    partial_steps: dict[int, int] = field(default_factory=dict)  # kept late clients -> steps they finished
    late: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    length_s: float = 0.0

    def metrics(self) -> dict:
        return {"virtual_time_s": self.start_s + self.length_s, "round_virtual_s": self.length_s,
                "sampled": len(self.sampled), "finished": len(self.kept) - len(self.partial_steps),
                "partial": len(self.partial_steps), "late": len(self.late), "dropped": len(self.dropped)}


def sample(system: SystemModel, population, cfg, round_idx: int, size: int, start_s: float) -> list[int]:
    """The clients a round samples (see the module's step 1)."""
    s = cfg.system
    if s.availability == "always" or s.unavailable == "fail":
        return population.cohort(cfg.seed, round_idx, size, cfg.train.cohort)
    online = np.flatnonzero(system.online(np.arange(len(population)), start_s))
    if len(online) <= size:
        return [int(c) for c in online]
    rng = np.random.default_rng([cfg.seed, 100 + COHORT, round_idx])
    return sorted(int(c) for c in rng.choice(online, size=size, replace=False))


def plan_round(system: SystemModel, population, cfg, round_idx: int, start_s: float, work) -> RoundPlan:
    """The round's plan. `work(client) -> (steps, samples_of_each_step)`: the client's local steps and
    the samples each covers (a list), as it would train the whole round."""
    s, k = cfg.system, cfg.train.clients_per_round
    size = math.ceil(s.overselect * k) if s.round == "overselect" else k
    begin = start_s
    if s.availability != "always" and s.unavailable == "skip":
        begin = system.next_online(start_s)  # with no client online, the round waits for the first one
    sampled = sample(system, population, cfg, round_idx, min(size, len(population)), begin)
    drops = system.drops(round_idx, sampled)
    if s.availability != "always" and s.unavailable == "fail":
        drops |= ~system.online(sampled, begin)
    slow = system.stragglers(round_idx, sampled, cfg.train.local_epochs) if s.round == "stragglers" else {}
    reporting, dropped, steps_of, late = [], [], {}, []
    for c, drop in zip(sampled, drops):
        steps = work(c)
        if c in slow:  # the steps of its first slow[c] epochs
            steps = steps[:len(steps) // cfg.train.local_epochs * slow[c]]
        duration = system.duration_s(c, sum(steps))
        if drop or not bool(system.online([c], begin + duration)[0]):
            dropped.append(c)
            continue
        if c in slow and not s.partial_work:
            late.append(c)
            continue
        reporting.append((duration, c))
        steps_of[c] = steps
    plan = RoundPlan(round_idx, start_s, list(sampled), [], late=late, dropped=dropped)
    if s.round == "stragglers":
        plan.partial_steps = {c: len(steps_of[c]) for _, c in reporting if c in slow}
    if s.round in ("wait_all", "stragglers"):
        plan.kept = sorted(c for _, c in reporting)
        plan.length_s = max((d for d, _ in reporting), default=0.0)
    elif s.round == "deadline":
        plan.length_s = min(s.deadline_s, max((d for d, _ in reporting), default=0.0))
        for duration, c in reporting:
            if duration <= s.deadline_s:
                plan.kept.append(c)
                continue
            done = _steps_by(system, c, steps_of[c], s.deadline_s) if s.partial_work else 0
            if done > 0:
                plan.kept.append(c)
                plan.partial_steps[c] = done
            else:
                plan.late.append(c)
        plan.kept.sort()
    else:  # overselect
        order = sorted(reporting)
        plan.kept = sorted(c for _, c in order[:k])
        plan.late = sorted(c for _, c in order[k:])
        plan.length_s = order[min(k, len(order)) - 1][0] if order else 0.0
    plan.length_s += begin - start_s
    return plan


def _steps_by(system: SystemModel, client: int, steps: list[int], deadline_s: float) -> int:
    """Local steps a client completes before the deadline, keeping time to upload them: the largest
    number whose samples train within deadline - download - upload."""
    budget = deadline_s - system.download_s(client) - system.upload_s(client)
    done, elapsed = 0, 0.0
    for samples in steps:
        elapsed += system.compute_s(client, samples)
        if elapsed > budget:
            break
        done += 1
    return done


class SyncClock:
    """The run's virtual clock over synchronous rounds: plans each round from the time it starts."""

    def __init__(self, system: SystemModel, population, cfg):
        self.system, self.population, self.cfg = system, population, cfg
        self.now_s = 0.0

    def plan(self, round_idx: int, work) -> RoundPlan:
        plan = plan_round(self.system, self.population, self.cfg, round_idx, self.now_s, work)
        self.now_s = plan.start_s + plan.length_s
        return plan

    def state_dict(self) -> dict:
        return {"now_s": self.now_s}

    def load_state_dict(self, state: dict) -> None:
        self.now_s = float(state["now_s"])

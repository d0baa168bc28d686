"""Asynchronous aggregation on the virtual clock: FedBuff (Nguyen et al., AISTATS 2022) and FedAsync (Xie
et al. 2019). One call of `run_async` is one server step (train.rounds counts them).

The schedule is an event heap over virtual time, a pure function of the seed, the system model and the
config, so every rank computes the same one:
  - C = system.concurrency clients are in flight. A client that starts at virtual time T trains from the
    model version v current then (v = server steps so far) and reports at T + its duration; its local
    randomness is keyed by (seed, v + 1, client), as a synchronous round v + 1's would be.
  - Reports are taken in order of (time, start number). One that dropped out (keyed dropout, or offline
    when it would report) or is staler than system.max_staleness is thrown away, and its slot refilled
    at once from the current version. The others wait in the buffer, holding their slot: a buffered client
    is not started again before the step applies it, nor one that dropped out (keyed) from this version.
  - When K updates are buffered (FedBuff: system.buffer_size; FedAsync: 1), the server steps: the
    buffered clients are trained now, each from the version it started from (kept while a client in
    flight needs it), dealt to ranks as a synchronous cohort is, and their weighted updates summed
    through the round's aggregator (one all_reduce). Then their K slots are refilled from the new model.
  - Nothing can report (no client can start, or HORIZON_PER_CLIENT reports per client thrown away in a
    row): the run stops with one line (NothingReports; docs/system.md).
  - Sampling: the clients a step (or the start) adds are a keyed sample of those idle (under
    availability with unavailable=skip, of those online), from the same stream as the synchronous cohort
    of round v + 1: with nothing in flight it *is* that cohort.
Weights, with s the update's staleness (server steps since its version) and w(s) system.staleness:
  FedBuff:  Delta = sum_i w(s_i) p_i Delta_i, p_i the method's weight over the buffer (n_i / sum n, or
            1/K), handed to the server optimizer (server.*) as FedAvg's mean update is;
  FedAsync: w <- (1 - a) w + a (w_start + Delta_i), a = system.async_alpha x w(s), i.e. the direction
            a (w_start - w + Delta_i), the (w_start - w) term added once (by rank 0) into the same sum.
So FedBuff with K = C = train.clients_per_round and max_staleness 0 is synchronous FedAvg, bit for bit.
One difference from FedBuff's paper: there a report frees its slot at once; here a buffered update holds
it until the step (at most K - 1 reports later), which is what makes the identity above exact.
"""
from __future__ import annotations

import heapq
import math

import numpy as np
import torch

from ..errors import ConfigError, NothingReports
from ..federation.population import place
from .staleness import staleness_weight

COHORT_STREAM = 1  # federation/population.py's _COHORT_STREAM: the synchronous cohort's stream
# The horizon: a server step ends the run once this many reports per client in a row were thrown away.
HORIZON_PER_CLIENT = 100


def _causes(s) -> str:
    """The settings that keep updates from reporting, for the line that stops a run."""
    causes = [f"system.dropout={s.dropout}" if s.dropout > 0 else "",
              f"system.availability={s.availability}" if s.availability != "always" else "",
              f"system.max_staleness={s.max_staleness}" if s.max_staleness >= 0 else ""]
    return f"check {', '.join(c for c in causes if c) or 'the system.* settings'}"


class AsyncEngine:
    def __init__(self, system):
        self.system = system
        trainer, cfg = system.trainer, system.cfg
        s = cfg.system
        if trainer.worker.buffers.numel():
            raise ConfigError(f"system.async_mode={s.async_mode}: model.name={cfg.model.name} has BatchNorm running "
                              "statistics, whose staleness-weighted mean is not defined; use a model without "
                              "BatchNorm (or model.norm=gn)")
        self.fedasync = s.async_mode == "fedasync"
        self.k = 1 if self.fedasync else s.buffer_size
        self.c = s.concurrency or cfg.train.clients_per_round
        self.now_s, self.version, self.seq, self.filled = 0.0, 0, 0, False
        self.flights: list[tuple] = []  # heap of (finish_s, seq, client, version, dropped)
        self.versions: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        # Clients that dropped out (keyed by the version) having started from the current version: none is
        # started again before the next step. Empty between steps, so checkpoints need not hold it.
        self.dropped_now: set[int] = set()

    # ---- the schedule --------------------------------------------------------------------------------
    def _idle(self, buffer) -> np.ndarray:
        """The clients a slot may start now: neither in flight nor waiting in the `buffer` (a buffered client
        holds its slot until the step that applies it), nor dropped out already at this version (its keyed
        dropout would drop it again)."""
        busy = np.zeros(len(self.system.trainer.population), dtype=bool)
        busy[[f[2] for f in (*self.flights, *buffer)]] = True
        busy[sorted(self.dropped_now)] = True
        return np.flatnonzero(~busy)

    def _start(self, count: int, buffer: list[tuple] = ()) -> None:
        """Start up to `count` idle clients at now_s from the current version."""
        if count <= 0:
            return
        system, cfg = self.system, self.system.cfg
        model = system.model
        eligible = self._idle(buffer)
        skip = cfg.system.availability != "always" and cfg.system.unavailable == "skip"
        if skip and len(eligible):
            eligible = eligible[model.online(eligible, self.now_s)]
        if not len(eligible):
            return
        rng = np.random.default_rng([cfg.seed, COHORT_STREAM, self.version + 1])
        chosen = sorted(int(c) for c in rng.choice(eligible, size=min(count, len(eligible)), replace=False))
        if self.version not in self.versions:
            trainer = system.trainer
            self.versions[self.version] = (trainer.global_params.clone(), trainer.global_buffers.clone())
        offline_now = cfg.system.availability != "always" and not skip
        drops = model.drops(self.version + 1, chosen)
        for c, drop in zip(chosen, drops):
            finish = self.now_s + model.duration_s(c, sum(system.steps(c)))
            drop = bool(drop) or not bool(model.online([c], finish)[0]) or \
                (offline_now and not bool(model.online([c], self.now_s)[0]))
            heapq.heappush(self.flights, (finish, self.seq, c, self.version, drop))
            self.seq += 1

    def _next_buffer(self, step: int) -> tuple[list[tuple], int, int]:
        """Reports in time order until K are buffered: (buffered flights, dropped, discarded). Raises
        NothingReports when no update can reach the buffer (docs/system.md: the horizon)."""
        s = self.system.cfg.system
        model = self.system.model
        if not self.filled:
            self._start(self.c)
            self.filled = True
        buffer, dropped, discarded = [], 0, 0
        horizon = HORIZON_PER_CLIENT * len(self.system.trainer.population)
        thrown = 0  # reports thrown away (and waits for a client to come online) since the last one buffered
        while len(buffer) < self.k:
            if thrown >= horizon:
                raise NothingReports(f"server step {step}: no update reached the buffer in {thrown} reports in a row "
                                     f"({HORIZON_PER_CLIENT} per client: dropped out, offline when it would report "
                                     f"or staler than system.max_staleness), with {len(buffer)} of {self.k} buffered "
                                     f"at virtual time {self.now_s:.0f} s; {_causes(s)}")
            if not self.flights:  # nobody could start (no idle client online): wait for the first one
                idle = self._idle(buffer)
                waited = model.next_online(self.now_s, idle) if len(idle) else math.inf
                if math.isinf(waited):
                    raise NothingReports(f"server step {step}: no update can reach the buffer ({len(buffer)} of "
                                         f"{self.k} buffered): every client that is not waiting in it dropped out at "
                                         f"this model version or is never online; {_causes(s)}")
                self.now_s = waited if waited > self.now_s else float(np.nextafter(self.now_s, np.inf))
                self._start(self.c - len(buffer), buffer)
                thrown += 1
                continue
            flight = heapq.heappop(self.flights)
            self.now_s = max(self.now_s, flight[0])
            stale = s.max_staleness >= 0 and self.version - flight[3] > s.max_staleness
            if flight[4] or stale:
                dropped += flight[4]
                discarded += stale and not flight[4]
                if flight[4] and flight[3] == self.version and model.drops(self.version + 1, [flight[2]])[0]:
                    self.dropped_now.add(flight[2])
                thrown += 1
                self._start(1, buffer)
                continue
            buffer.append(flight)
            thrown = 0
        return buffer, dropped, discarded

    # ---- one server step -----------------------------------------------------------------------------
    def run_async(self, step: int) -> dict:
        system, cfg = self.system, self.system.cfg
        trainer, s = system.trainer, cfg.system
        trainer.state.last_round = step
        trainer.algorithm.begin_round(step)
        buffer, dropped, discarded = self._next_buffer(step)
        by_client = {f[2]: f for f in buffer}
        cohort = sorted(by_client)
        stale = {c: self.version - by_client[c][3] for c in cohort}
        factor = {c: staleness_weight(s.staleness, stale[c], s.staleness_a, s.staleness_b) for c in cohort}
        stats = trainer.new_aggregator(cohort, extra_terms=self.fedasync)

        def start(run):  # from the version the client started from, keyed as that version's next round
            version = by_client[run.client_id][3]
            params, buffers = self.versions[version]
            run.round_idx, run.global_params = version + 1, params
            run.weight = (s.async_alpha if self.fedasync else run.weight) * factor[run.client_id]
            return buffers

        mine = place(cohort, trainer.population.sizes, trainer.ctx.world_size, False)[trainer.ctx.rank]
        trainer.train_clients(stats, step, cohort, [[c] for c in mine], start, label=f"server step {step}")
        if self.fedasync and trainer.ctx.is_main:  # a (w_start - w), once
            (c,) = cohort
            stats.add("delta", self.versions[by_client[c][3]][0] - trainer.global_params, s.async_alpha * factor[c])
        row = trainer.finish_round(step, cohort, stats, {})
        self.version += 1
        self.dropped_now = set()
        self._start(len(buffer))
        needed = {f[3] for f in self.flights}
        self.versions = {v: m for v, m in self.versions.items() if v in needed}
        return {**row, "virtual_time_s": self.now_s, "updates": len(cohort), "dropped": dropped,
                "discarded": discarded, "in_flight": len(self.flights),
                "staleness_mean": sum(stale.values()) / len(cohort), "staleness_max": max(stale.values())}

    # ---- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"now_s": self.now_s, "version": self.version, "seq": self.seq, "filled": self.filled,
                "flights": [list(f) for f in self.flights],
                "versions": {v: [p.cpu(), b.cpu()] for v, (p, b) in self.versions.items()}}

    def load_state_dict(self, state: dict) -> None:
        device = self.system.trainer.device
        self.now_s, self.version = float(state["now_s"]), int(state["version"])
        self.seq, self.filled = int(state["seq"]), bool(state["filled"])
        self.flights = [tuple(f) for f in state["flights"]]
        heapq.heapify(self.flights)
        self.versions = {int(v): (p.to(device), b.to(device)) for v, (p, b) in state["versions"].items()}

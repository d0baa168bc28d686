"""`distfl bench --suite system`: what the virtual clock costs (docs/system.md).

1. Per round: planning a synchronous round (speeds, dropouts, a deadline, partial work) against one
   training round of the runtime suite's workload (FMNIST, SimpleCNN, 100 clients, 10 a round), both in
   one process, medians of `repeats` interleaved measurements.
2. Asynchronous scheduling: FedBuff's event heap with 1,000 clients in flight (10,000 clients, K = 10):
   client updates scheduled per second, the schedule alone (reports taken in order, dropouts, refills,
   the versions kept); the training of those updates is the same cost as a synchronous client's.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from types import SimpleNamespace

WORKLOAD = [
    "seed=0", "data.dataset=fmnist", "partition.scheme=dirichlet", "partition.num_clients=100",
    "partition.alpha=0.5", "model.name=simplecnn", "train.clients_per_round=10", "train.local_epochs=1",
    "train.batch_size=32", "train.lr=0.1", "runtime.device=cpu", "runtime.threads=1", "output.tensorboard=false",
    "output.progress=none", "checkpoint.every=0", "system.speed=lognormal:0,1.5", "system.bandwidth=uniform:500,5000",
    "system.round=deadline", "system.deadline_s=30", "system.partial_work=true", "system.dropout=0.1",
    "algorithm.name=fedprox",
]
PLANS = 200  # rounds planned per measurement


def bench(repeats: int, log) -> dict:
    from .. import dist
    from ..config import load_config
    from ..federation.runner import Trainer

    with tempfile.TemporaryDirectory(prefix="distfl_bench_system_") as tmp:
        cfg = load_config(None, WORKLOAD + [f"output.dir={tmp}/run", "train.rounds=1"])
        ctx = dist.init(cfg.runtime.device, cfg.runtime.threads)
        trainer = Trainer(cfg, ctx)
        params = trainer.global_params.clone()
        log("warm-up: one round (untimed)")
        trainer.run_round(1)
        round_s, plan_s = [], []
        for rep in range(repeats):
            for what in (("round", "plan") if rep % 2 == 0 else ("plan", "round")):
                if what == "round":
                    trainer.global_params.copy_(params)
                    trainer.system.clock.now_s = 0.0
                    t0 = time.perf_counter()
                    trainer.run_round(1)
                    round_s.append(time.perf_counter() - t0)
                else:
                    t0 = time.perf_counter()
                    for t in range(1, PLANS + 1):
                        trainer.system.plan_round(t)
                    plan_s.append((time.perf_counter() - t0) / PLANS)
            log(f"repeat {rep + 1}/{repeats} done")
        trainer.close()
        dist.shutdown(ctx)
    updates = _async_schedule(repeats, log)
    plan, one_round = statistics.median(plan_s), statistics.median(round_s)
    return {"workload": WORKLOAD, "plan_s": plan_s, "round_s": round_s, "plan_median_s": plan,
            "round_median_s": one_round, "overhead_fraction": plan / one_round, **updates}


def _async_schedule(repeats: int, log, clients: int = 10000, in_flight: int = 1000, buffer: int = 10,
                    steps: int = 200) -> dict:
    """Updates per second through AsyncEngine's schedule with `in_flight` clients in flight."""
    import numpy as np
    import torch

    from ..config import load_config
    from ..federation.population import Population
    from ..system.handle import System

    cfg = load_config(None, [f"partition.num_clients={clients}", "system.async_mode=fedbuff",
                             f"system.concurrency={in_flight}", f"system.buffer_size={buffer}",
                             "system.speed=lognormal:0,1.5", "system.dropout=0.05", "system.max_staleness=50",
                             "train.clients_per_round=10"])
    sizes = np.random.default_rng(0).integers(20, 200, clients)
    population = Population([np.arange(n) for n in sizes])
    worker = SimpleNamespace(num_params=100_000, buffers=torch.zeros(0), fold_single=False)
    from ..algorithms.base import Algorithm

    trainer = SimpleNamespace(cfg=cfg, population=population, worker=worker, global_params=torch.zeros(100_000),
                              global_buffers=torch.zeros(0), pack_size=1, algorithm=Algorithm.__new__(Algorithm))
    rates = []
    for rep in range(repeats):
        engine = System(trainer).engine
        engine._next_buffer()  # the first C starts
        engine.version += 1
        t0 = time.perf_counter()
        done = 0
        for _ in range(steps):
            taken, _, _ = engine._next_buffer()
            engine.version += 1
            engine._start(len(taken))
            needed = {f[3] for f in engine.flights}
            engine.versions = {v: m for v, m in engine.versions.items() if v in needed}
            done += len(taken)
        rates.append(done / (time.perf_counter() - t0))
        log(f"async schedule repeat {rep + 1}/{repeats}: {rates[-1]:.0f} updates/s")
    return {"async_clients": clients, "async_in_flight": in_flight, "async_buffer": buffer,
            "async_updates_per_s": rates, "async_updates_per_s_median": statistics.median(rates)}


def markdown(res: dict) -> str:
    return (
        "# distfl bench --suite system\n\n"
        f"Workload: {' '.join(res['workload'])}; medians of {len(res['round_s'])} interleaved repeats.\n\n"
        "| what | median | note |\n|---|---|---|\n"
        f"| plan one synchronous round (deadline, partial work, dropout) | {1e3 * res['plan_median_s']:.3f} ms | "
        f"{PLANS} rounds planned per repeat |\n"
        f"| one training round (10 clients) | {1e3 * res['round_median_s']:.1f} ms | the plan included |\n"
        f"| clock overhead per round | {100 * res['overhead_fraction']:.2f}% | plan / round |\n"
        f"| FedBuff schedule, {res['async_in_flight']:,} in flight of {res['async_clients']:,} clients, "
        f"K = {res['async_buffer']} | {res['async_updates_per_s_median']:,.0f} updates/s | the schedule alone "
        "(no training) |\n")

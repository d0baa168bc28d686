"""Where a round of `distfl bench --suite runtime`'s workload (FedAvg, FMNIST, SimpleCNN, 10 clients of 100,
batch 32, 1 thread, CPU) spends its time: each piece of the runner timed where it runs (CPU time of this
process, summed over `--repeats` runs of `--rounds` rounds), as a share of the rounds' CPU time; beside it the
lean plain loop of the suite over the same batches, timed the same way; then one evaluation of the global
model (the whole test set) against one round.

    PYTHONPATH=. python bench/round_parts.py [--rounds 3] [--repeats 3]

The wrappers cost a few microseconds a call themselves (about 4,000 calls a round); read the shares, not the
milliseconds.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
import time

import torch

import distfl.federation.local as local
import distfl.models.base as models
from distfl.bench.harness import InProcess
from distfl.bench.runtime import workload_overrides
from distfl.federation.runner import Trainer

SPENT: dict[str, float] = {}


def timed(owner, name: str, label: str) -> None:
    """Replace `owner.name` by a wrapper adding its CPU time to SPENT[label]."""
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        start = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            SPENT[label] = SPENT.get(label, 0.0) + time.process_time() - start
    setattr(owner, name, wrapper)


def timed_batch_orders() -> None:
    """local.batch_indices, each draw timed (the generator runs between the steps that use its batches)."""
    inner = local.batch_indices

    def drawing(*args, **kwargs):
        batches = inner(*args, **kwargs)
        while True:
            start = time.process_time()
            idx = next(batches, None)
            SPENT["batch orders (randperm, slices)"] = (SPENT.get("batch orders (randperm, slices)", 0.0)
                                                        + time.process_time() - start)
            if idx is None:
                return
            yield idx
    local.batch_indices = drawing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    ip = InProcess(args.rounds, workload_overrides(args.rounds, tempfile.mkdtemp(prefix="round_parts_")))
    timed(local.LocalSGD, "train", "local SGD, all of it")
    timed(models.Classifier, "forward", "  forward (model)")
    timed(torch.Tensor, "backward", "  backward")
    timed_batch_orders()
    timed(Trainer, "contribute", "client statistics into the exact sum")
    timed(Trainer, "finish_round", "reduce, server step, the round's row")
    timed(Trainer, "client_run", "a client's run (weight, steps, LocalSGD)")
    timed(local.FlatModel, "load", "loading the global model")
    timed(local, "seed_local_rng", "seeding the client's generator")
    timed(Trainer, "_cohort", "cohort and placement")
    timed(Trainer, "new_aggregator", "the round's aggregator")
    ip.time_fl(1)  # warm-up
    SPENT.clear()
    total = sum(ip.time_fl()["cpu_s"] for _ in range(args.repeats))
    rounds = args.rounds * args.repeats
    print(f"{rounds} rounds, {sum(len(r) for r in ip.batches) * args.repeats} steps, {total:.2f} s CPU "
          f"({1e3 * total / rounds:.1f} ms a round); share of the rounds' CPU time:")
    for label, spent in sorted(SPENT.items(), key=lambda kv: -kv[1]):
        print(f"  {label:45s} {100 * spent / total:6.2f}%  {1e3 * spent / rounds:8.2f} ms a round")
    inside = SPENT["local SGD, all of it"] - SPENT["  forward (model)"] - SPENT["  backward"]
    print(f"  {'  local SGD besides forward and backward':45s} {100 * inside / total:6.2f}%  (batch gathers, "
          "loss, SGD step, loss sums, hooks)")
    fl = dict(SPENT)
    SPENT.clear()
    lean = sum(ip.time_centralised(step="lean")["cpu_s"] for _ in range(args.repeats))
    rest = lean - SPENT["  forward (model)"] - SPENT["  backward"]
    print(f"lean plain loop over the same batches: {lean:.2f} s CPU; forward {100 * SPENT['  forward (model)'] / lean:.2f}%, "
          f"backward {100 * SPENT['  backward'] / lean:.2f}%, besides them {100 * rest / lean:.2f}% "
          "(batch gathers, loss, SGD step)")
    print(f"FL / lean: all {total / lean:.3f}; forward {fl['  forward (model)'] / SPENT['  forward (model)']:.3f}, "
          f"backward {fl['  backward'] / SPENT['  backward']:.3f}, the rest {(total - fl['  forward (model)'] - fl['  backward']) / rest:.3f}")
    evals = []
    for _ in range(args.repeats):
        start = time.process_time()
        ip.trainer.evaluate()
        evals.append(time.process_time() - start)
    per_round = total / rounds
    print(f"one evaluation of the global model (test set): {statistics.median(evals):.3f} s CPU = "
          f"{statistics.median(evals) / per_round:.2f} rounds")


if __name__ == "__main__":
    main()

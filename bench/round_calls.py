"""Count the calls one FedAvg round makes from one distfl file into another.

    PYTHONPATH=. OMP_NUM_THREADS=1 python bench/round_calls.py [--rounds-before 1] [--top 15]

Builds a one-rank CPU Trainer of a small FedAvg run (synthetic 1x8x8 images, the mlp, 12 clients, 5 a
round, no evaluation inside the round), trains `--rounds-before` rounds to warm it up, then records round
`--rounds-before + 1` with sys.setprofile: every Python call whose caller and callee are both in distfl/.

  cross-module calls   calls whose caller's file differs from the callee's
  file crossings       distinct (caller file -> callee file) pairs among them
  files                distinct distfl files the round's calls enter

A measure of how many seams a round crosses (how far one must read to follow it), not of speed.
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "seed": 3,
    "data": {"dataset": "synthetic"},
    "partition": {"scheme": "dirichlet", "num_clients": 12, "alpha": 0.5},
    "model": {"name": "mlp"},
    "train": {"rounds": 3, "clients_per_round": 5, "lr": 0.1, "batch_size": 16},
    "eval": {"every": 1000},
    "checkpoint": {"every": 0},
    "output": {"progress": "none", "tensorboard": False},
}


def count(rounds_before: int) -> tuple[collections.Counter, set]:
    import distfl
    from distfl import dist
    from distfl.config import config_from_dict
    from distfl.federation.runner import Trainer

    package = str(Path(distfl.__file__).resolve().parent) + "/"
    crossings: collections.Counter = collections.Counter()
    files: set = set()

    def profile(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_code.co_filename
        caller = frame.f_back.f_code.co_filename if frame.f_back is not None else ""
        if not callee.startswith(package):
            return
        files.add(callee[len(package):])
        if caller.startswith(package) and caller != callee:
            crossings[(caller[len(package):], callee[len(package):])] += 1

    with tempfile.TemporaryDirectory() as out:
        cfg = config_from_dict({**CONFIG, "output": {**CONFIG["output"], "dir": str(Path(out) / "run")}})
        trainer = Trainer(cfg, dist.init("cpu", 1))
        try:
            with dist.deterministic_ops():
                for t in range(1, rounds_before + 1):
                    trainer.run_round(t)
                sys.setprofile(profile)
                try:
                    trainer.run_round(rounds_before + 1)
                finally:
                    sys.setprofile(None)
        finally:
            trainer.close()
    return crossings, files


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds-before", type=int, default=1, help="rounds trained before the one counted")
    parser.add_argument("--top", type=int, default=15, help="crossings listed, most calls first")
    args = parser.parse_args(argv)
    crossings, files = count(args.rounds_before)
    print(f"one FedAvg round (round {args.rounds_before + 1}): {sum(crossings.values())} cross-module calls, "
          f"{len(crossings)} file crossings, {len(files)} files")
    for (caller, callee), calls in crossings.most_common(args.top):
        print(f"  {calls:6d}  {caller} -> {callee}")


if __name__ == "__main__":
    main()

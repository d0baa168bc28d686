"""Start-up and round cost of a prepared natural federation against its number of clients.

Writes prepared folders (`distfl data prepare`'s format) shaped like StackOverflow's federation (small
per client): 1,000, 3,400 (FEMNIST's writers) and 342,477 clients, each with 4 training and 1 test sample
of 8 features per client, 10 classes. Then, in a fresh process per measurement, interleaved, `repeats`
times: the seconds to load the data (memory-mapped; its bytes hashed, in a background thread since the
hash moved there), to build the Trainer (partition, population, model, checks), of one round of 10
clients (mclr, batch 4), and what the first checkpoint then still waits for the data's hash
(hash_wait_s); medians reported.
`--tree DIR` (repeatable) measures the distfl source tree DIR (a `git worktree` of another commit, say)
instead of this one, interleaved with the others, to compare two versions under the same load.

    PYTHONPATH=. python bench/natural_startup.py [--repeats 3] [--tree DIR ...] [--out bench/results/natural_startup.txt]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import numpy as np

CLIENTS = (1_000, 3_400, 342_477)
PER_CLIENT = 4
FEATURES = 8

PROBE = r'''
import json, sys, time
t0 = time.perf_counter()
from distfl import dist
from distfl.config import load_config
from distfl.data.datasets import load_dataset
from distfl.federation.runner import Trainer
cfg = load_config(None, sys.argv[2:])
t1 = time.perf_counter()
loaded = load_dataset(cfg.data, 0)
t2 = time.perf_counter()
for _, digest in loaded.sources.values():  # this load's hash (a background thread's, distfl/data/digest.py), waited
    if not isinstance(digest, str):         # for uncounted: the trainer's set-up meets only its own, as a run's does
        digest.result()
t2b = time.perf_counter()
trainer = Trainer(cfg, dist.init("cpu", 1))
t3 = time.perf_counter()
trainer.run_round(1)
t4 = time.perf_counter()
recorded = dict(trainer.data_sources.items())  # the data's SHA-256 as a checkpoint records it (may wait for it)
t5 = time.perf_counter()
trainer.close()
print(json.dumps({"load_data_s": t2 - t1, "trainer_set_up_s": t3 - t2b, "round_s": t4 - t3, "hash_wait_s": t5 - t4}))
'''


def _write(folder: str, clients: int) -> None:
    from distfl.data.natural import Federated
    from distfl.data.prepared import write_prepared

    rng = np.random.default_rng(0)
    n = clients * PER_CLIENT
    fed = Federated(rng.normal(size=(n, 1, 1, FEATURES)).astype(np.float32), rng.integers(0, 10, n),
                    np.arange(clients + 1, dtype=np.int64) * PER_CLIENT,
                    rng.normal(size=(clients, 1, 1, FEATURES)).astype(np.float32), rng.integers(0, 10, clients),
                    np.arange(clients + 1, dtype=np.int64), 10, "bench",
                    client_ids=[f"user{k}" for k in range(clients)])
    write_prepared(fed, folder, "bench", "generated")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench/results/natural_startup.txt")
    parser.add_argument("--tree", action="append", default=[], help="a distfl source tree to measure (repeatable)")
    args = parser.parse_args()
    trees = [os.path.abspath(t) for t in args.tree] or [os.getcwd()]
    with tempfile.TemporaryDirectory() as tmp:
        for clients in CLIENTS:
            _write(os.path.join(tmp, f"c{clients}"), clients)
        runs = {(t, c): [] for t in trees for c in CLIENTS}
        for _ in range(args.repeats):
            for clients in CLIENTS:
                for tree in trees:
                    overrides = ["data.dataset=prepared", f"data.path={tmp}/c{clients}", "partition.scheme=natural",
                                 f"partition.num_clients={clients}", "model.name=mclr", "train.rounds=1",
                                 "train.batch_size=4", f"output.dir={tmp}/run{clients}", "output.progress=none",
                                 "output.tensorboard=false"]
                    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": tree}
                    proc = subprocess.run([sys.executable, "-c", PROBE, "probe", *overrides], env=env, cwd=tree,
                                          capture_output=True, text=True, check=True)
                    runs[tree, clients].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    lines = [f"# {' '.join(sys.argv)}; medians of {args.repeats} interleaved repeats, 1 thread, seconds",
             f"{'clients':>8} {'load_data_s':>12} {'trainer_set_up_s':>17} {'round_s':>8} {'hash_wait_s':>12}" + ("  tree" if args.tree else "")]
    for clients in CLIENTS:
        for tree in trees:
            med = {k: statistics.median(r[k] for r in runs[tree, clients]) for k in runs[tree, clients][0]}
            lines.append(f"{clients:>8} {med['load_data_s']:>12.3f} {med['trainer_set_up_s']:>17.3f} "
                         f"{med['round_s']:>8.3f} {med['hash_wait_s']:>12.3f}" + (f"  {os.path.basename(tree)}" if args.tree else ""))
    text = "\n".join(lines)
    print(text)
    with open(args.out, "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()

"""`distfl bench --suite ffc`: what SphereFed's calibration costs, beside a training round.

Its features of every client, one all_reduce of Z^T Z and Z^T Y, and the d x d solve, against one
training round on the same 10 clients (FMNIST, SimpleCNN with the sphere head, Dirichlet 0.5: the
evidence setup of configs/paper/spherefed/), both in one process, medians of `repeats` interleaved
measurements; and the bytes each all-reduces.
"""
from __future__ import annotations

import statistics
import tempfile
import time

FFC_WORKLOAD = [
    "seed=0", "data.dataset=fmnist", "partition.scheme=dirichlet", "partition.num_clients=10",
    "partition.alpha=0.5", "model.name=simplecnn", "model.head=sphere", "algorithm.name=fedavg",
    "train.clients_per_round=10", "train.local_epochs=1", "train.batch_size=64", "train.lr=0.05",
    "train.momentum=0.9", "calibration.method=ffc", "runtime.device=cpu", "runtime.threads=1",
    "output.tensorboard=false", "output.progress=none", "checkpoint.every=0",
]


def bench(repeats: int, log) -> dict:
    from .. import dist
    from ..algorithms.ffc import FFCPhase
    from ..config import load_config
    from ..federation.runner import Trainer
    from ..logging import RunLogger

    with tempfile.TemporaryDirectory(prefix="distfl_bench_ffc_") as tmp:
        cfg = load_config(None, FFC_WORKLOAD + [f"output.dir={tmp}/run", "train.rounds=1"])
        ctx = dist.init(cfg.runtime.device, cfg.runtime.threads)
        trainer = Trainer(cfg, ctx)
        trainer.run_dir.mkdir(parents=True, exist_ok=True)
        logger = RunLogger(trainer.run_dir, cfg.output, True, 1, 1)
        head = trainer.worker.module.head.weight.clone()
        params = trainer.global_params.clone()
        round_s, ffc_s, parts = [], [], []
        log("warm-up: one round and one calibration (untimed)")
        trainer.run_round(1)
        FFCPhase().run(trainer.context, logger)
        for rep in range(repeats):
            for what in (("round", "ffc") if rep % 2 == 0 else ("ffc", "round")):
                trainer.global_params.copy_(params)
                trainer.worker.module.head.weight.copy_(head)
                trainer.worker.module.feature_norm = True
                trainer.worker.module.loss_kind = "mse"
                t0 = time.perf_counter()
                if what == "round":
                    row = trainer.run_round(1)
                    round_s.append(time.perf_counter() - t0)
                    round_bytes = row["bytes_reduced"]
                else:
                    result = FFCPhase().run(trainer.context, logger)
                    # The phase also evaluates the model twice (before/after); the calibration itself is:
                    ffc_s.append(result["features_s"] + result["reduce_s"] + result["solve_s"])
                    parts.append(result)
                log(f"repeat {rep + 1}/{repeats}: {what} done")
        logger.close()
        dist.shutdown(ctx)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    d = trainer.worker.module.feature_dim
    c = trainer.data.num_classes
    return {
        "workload": FFC_WORKLOAD, "repeats": repeats, "feature_dim": d, "num_classes": c,
        "clients": 10, "samples": parts[-1]["samples"],
        "round_s_median": med(round_s), "round_s": round_s,
        "ffc_s_median": med(ffc_s), "ffc_s": ffc_s,
        "ffc_features_s_median": med([p["features_s"] for p in parts]),
        "ffc_reduce_s_median": med([p["reduce_s"] for p in parts]),
        "ffc_solve_s_median": med([p["solve_s"] for p in parts]),
        "ffc_over_round": med(ffc_s) / med(round_s),
        "round_bytes": round_bytes, "ffc_bytes": parts[-1]["bytes_reduced"],
        "ffc_values": d * (d + 1) // 2 + d * c + 2,
    }


def markdown(res: dict) -> str:
    rows = [
        ("One training round (10 clients, 1 epoch), median", f"{res['round_s_median']:.2f} s"),
        ("FFC: features + reduce + solve, median", f"{res['ffc_s_median']:.2f} s "
         f"({res['ffc_features_s_median']:.2f} + {res['ffc_reduce_s_median']:.4f} + {res['ffc_solve_s_median']:.4f})"),
        ("FFC / training round", f"{res['ffc_over_round']:.3f}"),
        ("Bytes all-reduced: training round", f"{res['round_bytes']:,}"),
        ("Bytes all-reduced: FFC (upper triangle of Z^T Z, Z^T Y, 2 counts; int64)",
         f"{res['ffc_bytes']:,} ({res['ffc_values']:,} values, d = {res['feature_dim']}, C = {res['num_classes']})"),
    ]
    lines = ["| SphereFed FFC cost | measured |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows]
    return "\n".join(lines) + "\n"

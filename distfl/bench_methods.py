"""`distfl bench --suite ffc|tct`: what the paper methods' extra phases cost, beside a training round.

ffc: SphereFed's calibration (features of every client, one all_reduce of Z^T Z and Z^T Y, the d x d
solve) against one training round on the same 10 clients (FMNIST, SimpleCNN with the sphere head,
Dirichlet 0.5: the evidence setup of configs/paper/spherefed/), both in one process, medians of
`repeats` interleaved measurements; and the bytes each all-reduces.
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


def bench_ffc(repeats: int, log) -> dict:
    from . import dist
    from .algorithms.ffc import FFCPhase
    from .config import load_config
    from .federation.runner import Trainer
    from .logging import RunLogger

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
        FFCPhase().run(trainer, logger)
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
                    result = FFCPhase().run(trainer, logger)
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


def ffc_markdown(res: dict) -> str:
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


def bench_tct(repeats: int, log) -> dict:
    """TCT's two heavy parts, each beside its reference, on real Fashion-MNIST inputs and SimpleCNN:
    - eNTK features: vectorised `torch.func` chunks vs Algorithm 3's one-backward-per-sample loop
      (the same samples, all 44,426 coordinates);
    - stage 2 on one client: the closed-form M = 500 steps vs 500 literal steps (n = 1,000 samples,
      p = 4,096 coordinates, float64), both from the same start; the closed form's one-time
      decomposition is reported apart and amortised over the paper's 100 rounds.
    """
    import torch

    from .config import load_config
    from .data.datasets import load_dataset
    from .models import build_model
    from .tct.features import coordinate_index, entk_features, entk_features_loop
    from .tct.solver import LocalLeastSquares

    torch.set_num_threads(1)
    cfg = load_config(None, ["data.dataset=fmnist", "model.name=simplecnn"])
    data = load_dataset(cfg.data, 0)
    torch.manual_seed(0)
    model = build_model(cfg.model, data.input_shape, data.num_classes)
    num = sum(p.numel() for p in model.parameters())
    index = coordinate_index(num, num, 123)
    x = data.train_x[:256]
    vec_s, loop_s = [], []
    for rep in range(repeats):
        for what in (("vec", "loop") if rep % 2 == 0 else ("loop", "vec")):
            t0 = time.perf_counter()
            if what == "vec":
                vec = entk_features(model, x, index, chunk_size=128)
                vec_s.append(time.perf_counter() - t0)
            else:
                ref = entk_features_loop(model, x, index)
                loop_s.append(time.perf_counter() - t0)
            log(f"features repeat {rep + 1}/{repeats}: {what} done")
    feature_error = float((vec - ref).abs().max() / ref.abs().max())
    from .tct.features import _layer_wise_plan, feature_parameters

    method = ("layer-wise (one batched backward)" if _layer_wise_plan(model, feature_parameters(model, "all"))
              is not None else "torch.func vmap")

    n, p, c, m, eta = 1000, 4096, 10, 500, 5e-5
    z = entk_features(model, data.train_x[:n], coordinate_index(num, p, 123), chunk_size=128)
    std = z.std(0)
    z = torch.where(std > 1e-7 * std.max(), (z - z.mean(0)) / std, torch.zeros_like(z))  # as the TCT phase
    y = torch.nn.functional.one_hot(data.train_y[:n], c).double() - 1.0 / c
    closed_s, iter_s, decompose_s = [], [], []
    for rep in range(repeats):
        solver = LocalLeastSquares(z, y)
        psi0, h = solver.zeros(), solver.zeros()
        t0 = time.perf_counter()
        solver.decompose()
        decompose_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        closed = solver.closed_form(psi0, h, eta, m)
        closed_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        iterative = solver.iterative(psi0, h, eta, m)
        iter_s.append(time.perf_counter() - t0)
        log(f"stage 2 repeat {rep + 1}/{repeats}: closed form {closed_s[-1]:.3f} s, iterative {iter_s[-1]:.1f} s")
    med = statistics.median
    rounds = 100
    return {
        "features": {"samples": len(x), "coordinates": num, "method": method, "vectorised_s": med(vec_s), "loop_s": med(loop_s),
                     "vectorised_s_all": vec_s, "loop_s_all": loop_s, "speedup": med(loop_s) / med(vec_s),
                     "target_speedup": 10, "max_relative_difference": feature_error,
                     "vectorised_samples_per_s": len(x) / med(vec_s), "loop_samples_per_s": len(x) / med(loop_s)},
        "stage2": {"n": n, "p": p, "classes": c, "local_steps": m, "lr": eta, "basis": solver.basis,
                   "decompose_s": med(decompose_s), "closed_form_round_s": med(closed_s),
                   "iterative_round_s": med(iter_s), "per_round_speedup": med(iter_s) / med(closed_s),
                   "speedup_over_100_rounds": rounds * med(iter_s) / (med(decompose_s) + rounds * med(closed_s)),
                   "target_speedup": 20,
                   "relative_difference": float((closed - iterative).norm() / iterative.norm())},
        "repeats": repeats, "threads": 1,
    }


def tct_markdown(res: dict) -> str:
    f, s = res["features"], res["stage2"]
    rows = [
        (f"eNTK features, {f['samples']} FMNIST samples x {f['coordinates']:,} coordinates, SimpleCNN, "
         f"1 thread: vectorised, {f['method']}",
         f"{f['vectorised_s']:.2f} s ({f['vectorised_samples_per_s']:.0f} samples/s)", ""),
        ("... Algorithm 3's per-sample loop", f"{f['loop_s']:.2f} s ({f['loop_samples_per_s']:.0f} samples/s)", ""),
        ("... speedup (max relative difference)", f"{f['speedup']:.2f}x ({f['max_relative_difference']:.1e})",
         f">= {f['target_speedup']}x: {'met' if f['speedup'] >= f['target_speedup'] else '**not met**'}"),
        (f"Stage 2, one client (n = {s['n']}, p = {s['p']:,}): {s['local_steps']} iterative steps",
         f"{s['iterative_round_s']:.2f} s per round", ""),
        ("... closed form (basis: " + s["basis"] + ")", f"{s['closed_form_round_s']:.4f} s per round + "
         f"{s['decompose_s']:.2f} s once", ""),
        ("... speedup per round / over 100 rounds (decomposition included)",
         f"{s['per_round_speedup']:.0f}x / {s['speedup_over_100_rounds']:.1f}x (relative difference {s['relative_difference']:.1e})",
         f">= {s['target_speedup']}x: {'met' if s['speedup_over_100_rounds'] >= s['target_speedup'] else '**not met**'}"),
    ]
    lines = ["| TCT cost | measured | target |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines) + "\n"

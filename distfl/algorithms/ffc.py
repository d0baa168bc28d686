"""FFC, SphereFed's fast federated calibration (Dong et al., ECCV 2022, Sec. 4.3, Eqs. 6-10, App. C.1).

After training, the feature extractor is frozen and the classifier is replaced by the least-squares fit
of one-hot targets on the L2-normalised features of all training data:

    W*^T = (sum_k Z_k^T Z_k + lambda I)^-1 sum_k Z_k^T Y_k          (Eq. 10; Eq. 12 with lambda)

Client k contributes A_k = Z_k^T Z_k (d x d) and B_k = Z_k^T Y_k (d x C), never its features. Here each
rank adds its clients' A_k, B_k into one buffer and a single all_reduce sums them; every rank then
solves the same d x d system. Works for any head and any training algorithm (App. C.3: FFC on
cross-entropy features too).

Choices where the paper is silent (all documented in docs/algorithms/spherefed.md):
- features in eval mode (BatchNorm running statistics), no augmentation, in float64;
- under FedBN each client's features come from its own model, the global one with its own BatchNorm
  (a client never sampled has none and uses the global BatchNorm), the rule of per-client evaluation;
  clients are then placed as in training (sticky with the in-memory store, where their state lives);
- the rows of Z are always L2-normalised (Eq. 7), also for a model trained without normalisation; the
  calibrated model then normalises its features and is scored as a least-squares classifier;
- clients: all of them (`calibration.clients=all`, the paper's "each client"), or only the last
  round's cohort;
- sums are exact: A is symmetric, so only its upper triangle travels; each client's A_k, B_k are
  rounded to units of 2^-f with f as large as int64 allows for this data (about 2^-45 for FMNIST), and
  summed as integers, so 1 rank and N ranks give the same bits (federation/aggregate.py);
- solver: Cholesky of A + lambda I in float64; if it fails or A is numerically singular (with
  lambda = 0, as in the paper, A has rank <= number of samples and collapses under neural collapse),
  the minimum-norm solution through the eigendecomposition (pseudo-inverse, eigenvalues below
  d * eps * max dropped). Never NaN weights.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import checkpoint
from ..federation.aggregate import Segment, StatBuffer
from ..federation.phases import Phase, calibration_clients, evaluate_calibrated, hosted_client_models, log_result

STATS_FILE = "ffc_stats.pt"  # A, B, N and the float64 solution, for re-solving with another lambda


@torch.no_grad()
def client_sums(model, x: torch.Tensor, y: torch.Tensor, num_classes: int, batch_size: int):
    """A_k = Z^T Z, B_k = Z^T Y in float64 over one client's samples; also the count of all-zero features."""
    model.eval()
    d = model.feature_dim
    a = torch.zeros(d, d, dtype=torch.float64, device=x.device)
    b = torch.zeros(d, num_classes, dtype=torch.float64, device=x.device)
    zeros = 0
    for start in range(0, len(y), batch_size):
        h = model.features(x[start : start + batch_size]).to(torch.float64)
        z = F.normalize(h, dim=1, eps=1e-12)
        zeros += int((h.abs().amax(1) == 0).sum())
        a += z.t() @ z
        b += z.t() @ F.one_hot(y[start : start + batch_size], num_classes).to(torch.float64)
    return a, b, zeros


def solve(a: torch.Tensor, b: torch.Tensor, ridge: float) -> tuple[torch.Tensor, dict]:
    """W*^T = (A + ridge I)^-1 B in float64: Cholesky, else the pseudo-inverse. Returns (W*^T, info)."""
    d = a.shape[0]
    m = a + ridge * torch.eye(d, dtype=torch.float64, device=a.device)
    eig = torch.linalg.eigvalsh(m)
    top, low = float(eig[-1]), float(eig[0])
    cutoff = d * torch.finfo(torch.float64).eps * max(top, 0.0)
    info = {"eig_max": top, "eig_min": low,
            "condition_number": top / low if low > 0 else None,  # None: singular
            "rank": int((eig > cutoff).sum())}
    factor, failed = torch.linalg.cholesky_ex(m)
    if int(failed) == 0 and low > cutoff:
        wt = torch.cholesky_solve(b, factor)
        info["solver"] = "cholesky"
    else:
        values, vectors = torch.linalg.eigh(m)
        keep = values > cutoff
        inv = torch.where(keep, 1.0 / torch.where(keep, values, torch.ones_like(values)), torch.zeros_like(values))
        wt = vectors @ (inv[:, None] * (vectors.t() @ b))
        info["solver"] = "pseudo-inverse"
    if not bool(torch.isfinite(wt).all()):  # cannot happen with the guards above; never install NaNs
        raise FloatingPointError("FFC produced non-finite weights")
    return wt, info


def fixed_point_bits(max_client_samples: int, num_clients: int) -> int:
    """The finest 2^-f at which num_clients terms of magnitude <= max_client_samples sum exactly in
    int64 (the segments accumulate each term as int64: federation/aggregate.py).

    Every entry of A_k and B_k is a sum of products of unit-vector coordinates, so it is at most n_k.
    """
    bound = max(1, max_client_samples) * max(1, num_clients)
    return min(52, 61 - math.ceil(math.log2(bound + 1)))


def apply_calibrated_head(model) -> None:
    """After FFC the model is W* z with z the normalised features: a least-squares classifier."""
    model.feature_norm = True
    model.loss_kind = "mse"


class FFCPhase(Phase):
    name = "ffc"

    def run(self, context, logger) -> dict:
        cfg, ctx = context.cfg, context.ctx
        c = context.data.num_classes
        model = context.worker.module
        d = model.feature_dim
        t0 = time.perf_counter()
        acc_before, loss_before = context.evaluate()

        clients = calibration_clients(context)
        sizes = context.population.sizes
        bits = fixed_point_bits(max(int(sizes[k]) for k in clients), len(clients))
        upper = torch.triu_indices(d, d, device=context.device)
        stats = StatBuffer([Segment("ztz", upper.shape[1], frac_bits=bits, accumulate="int64"),
                            Segment("zty", d * c, frac_bits=bits, accumulate="int64"),
                            Segment("samples", 1, kind="int"), Segment("zero_features", 1, kind="int")],
                           context.device, len(clients))
        t_features = time.perf_counter()
        # FedBN: a client's features come from its own model (hosted_client_models).
        for k, idx in hosted_client_models(context, clients):
            a, b, zeros = client_sums(model, context.data.train_x[idx], context.data.train_y[idx], c,
                                      cfg.calibration.batch_size)
            stats.add("ztz", a[upper[0], upper[1]])
            stats.add("zty", b)
            stats.add("samples", len(idx))
            stats.add("zero_features", zeros)
        t_reduce = time.perf_counter()
        reduced = stats.reduce(ctx, name="ffc")
        t_solve = time.perf_counter()
        a = torch.zeros(d, d, dtype=torch.float64, device=context.device)
        a[upper[0], upper[1]] = reduced["ztz"]
        a = a + a.triu(1).t()
        b = reduced["zty"].view(d, c)
        n = int(reduced["samples"][0])
        zero = int(reduced["zero_features"][0])
        trace = float(a.trace())
        # Unit features: trace(sum Z^T Z) = number of samples (those with a non-zero feature). A
        # mismatch means a wrong sum, which must not be solved quietly.
        if abs(trace - (n - zero)) > 1e-9 * max(n, 1) + 1e-6:
            raise RuntimeError(f"FFC: trace(sum Z^T Z) = {trace!r} but {n - zero} samples have unit features; "
                               "the summed statistics are wrong")
        wt, info = solve(a, b, cfg.calibration.ridge)
        solve_s = time.perf_counter() - t_solve

        weight = wt.t().to(torch.float32)
        if "head.weight" in context.worker.param_slices:  # a learnable linear head lives in the flat model
            context.global_params[context.worker.param_slices["head.weight"]] = weight.reshape(-1)
            if "head.bias" in context.worker.param_slices:
                context.global_params[context.worker.param_slices["head.bias"]] = 0.0
        else:  # a fixed head is a frozen buffer of the model
            model.head.weight.copy_(weight)
        apply_calibrated_head(model)
        # With eval.clients, each client's own model (FedBN: its own BatchNorm) with the calibrated head.
        after = evaluate_calibrated(context, self.name)
        acc_after = after["test_acc"]

        if ctx.is_main:
            checkpoint.atomic_torch_save(
                {"ztz": a.cpu(), "zty": b.cpu(), "samples": n, "ridge": cfg.calibration.ridge,
                 "weight_t": wt.cpu(), "clients": clients},
                Path(context.run_dir) / STATS_FILE)
        result = {
            "test_acc_before": acc_before, "test_loss_before": loss_before,
            **after,
            "clients": len(clients), "samples": n, "zero_features": zero, "trace": trace,
            "ridge": cfg.calibration.ridge, **info,
            "features_s": t_reduce - t_features, "reduce_s": t_solve - t_reduce, "solve_s": solve_s,
            "total_s": time.perf_counter() - t0, "bytes_reduced": stats.nbytes, "fixed_point_bits": bits,
        }
        if info["solver"] != "cholesky":
            logger.info(f"FFC: sum Z^T Z + {cfg.calibration.ridge} I is singular or ill-conditioned "
                        f"(rank {info['rank']} of {d}, smallest eigenvalue {info['eig_min']:.3g}); used the "
                        "minimum-norm (pseudo-inverse) solution. Set calibration.ridge > 0 for a regularised fit")
        logger.info(f"FFC on {len(clients)} clients, {n} samples: test accuracy {100 * acc_before:.2f}% -> "
                    f"{100 * acc_after:.2f}%, condition number {info['condition_number'] or float('inf'):.3g}, "
                    f"{result['total_s']:.2f}s")
        log_result(logger, context, self.name, result)
        return result

    def restore(self, context) -> None:
        apply_calibrated_head(context.worker.module)

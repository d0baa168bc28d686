"""CCVR, classifier calibration with virtual representations (Luo, Chen, Hu, Zhang, Liang, Feng, "No Fear
of Heterogeneity: Classifier Calibration for Federated Learning with Non-IID Data", NeurIPS 2021, Sec. 4).

After training, the feature extractor is frozen. Client k computes, for each class c it holds, the count
N_{c,k}, mean mu_{c,k} and unbiased covariance Sigma_{c,k} of the features z the classifier reads. The
server fits one Gaussian per class (Eqs. 3-4):

    mu_c    = sum_k N_{c,k} / N_c mu_{c,k}
    Sigma_c = sum_k (N_{c,k} - 1) / (N_c - 1) Sigma_{c,k} + sum_k N_{c,k} / (N_c - 1) mu_{c,k} mu_{c,k}^T
              - N_c / (N_c - 1) mu_c mu_c^T

which are exactly the mean and unbiased covariance of the pooled features (tests/methods/test_ccvr.py), draws M_c
virtual features of class c from N(mu_c, Sigma_c), and retrains the classifier on them.

Here a client adds N_{c,k} mu_{c,k} and (N_{c,k} - 1) Sigma_{c,k} + N_{c,k} mu_{c,k} mu_{c,k}^T (the two
sums Eq. 4 needs over k, the second symmetric: its upper triangle) and N_{c,k} into one buffer; one
all_reduce sums them over ranks, exactly (fixed point, federation/aggregate.py), so every rank holds the
same Gaussians on 1 or N ranks. The unit of the fixed point comes from the largest feature of any client,
agreed by one MAX all_reduce before the sums. Every rank then draws the same virtual features (a torch
generator seeded by `seed`) and retrains the same head, on the CPU.

Choices where the paper is silent (docs/algorithms/ccvr.md):
- features in eval mode (BatchNorm running statistics), no augmentation, in float64; what the head reads
  (`model.represent`: after MOON's projection head, normalised with model.feature_norm);
- under FedBN each client's features come from its own model, as FFC's (federation/phases.py);
- a class seen once has covariance 0 (its virtual features are its one feature); an unseen class gets
  none; Sigma_c is sampled through its eigendecomposition, negative round-off eigenvalues set to 0, so a
  singular covariance (d > N_c, dead ReLU units) samples within its support;
- the head is retrained from its trained weights with SGD (calibration.retrain_*) on the model's own loss
  (cross-entropy unless model.loss=mse), mini-batches in an order drawn from `seed` each pass.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import checkpoint, dist
from ..errors import ConfigError
from ..federation.aggregate import Segment, StatBuffer
from ..federation.phases import Phase, calibration_clients, evaluate_calibrated, hosted_client_models, log_result

STATS_FILE = "ccvr_stats.pt"  # counts, mu_c, Sigma_c and the virtual feature counts of the run's calibration
_SAMPLE_STREAM = 6  # distinct from population.py's (1, 2), client_test.py's (3, 4), client_eval.py's (5)


@torch.no_grad()
def client_features(model, x: torch.Tensor, batch_size: int) -> torch.Tensor:
    """The features the head reads (`model.represent`), in eval mode, as float64."""
    model.eval()
    return torch.cat([model.represent(x[s : s + batch_size]).to(torch.float64) for s in range(0, len(x), batch_size)])


def class_statistics(z: torch.Tensor, y: torch.Tensor, num_classes: int):
    """One client's per-class N_{c,k} (C), mu_{c,k} (C x d) and unbiased Sigma_{c,k} (C x d x d; 0 for a class
    it holds fewer than 2 samples of), in z's dtype."""
    d = z.shape[1]
    counts = torch.bincount(y, minlength=num_classes)
    means = torch.zeros(num_classes, d, dtype=z.dtype, device=z.device)
    covs = torch.zeros(num_classes, d, d, dtype=z.dtype, device=z.device)
    for c in torch.nonzero(counts).flatten().tolist():
        zc = z[y == c]
        means[c] = zc.mean(0)
        if len(zc) > 1:
            centred = zc - means[c]
            covs[c] = centred.t() @ centred / (len(zc) - 1)
    return counts, means, covs


def client_terms(counts: torch.Tensor, means: torch.Tensor, covs: torch.Tensor):
    """What a client adds for Eqs. 3-4: N_{c,k} mu_{c,k} and (N_{c,k} - 1) Sigma_{c,k} + N_{c,k} mu_{c,k} mu_{c,k}^T."""
    n = counts.to(means.dtype)
    first = n[:, None] * means
    second = (n - 1).clamp(min=0)[:, None, None] * covs + n[:, None, None] * means[:, :, None] * means[:, None, :]
    return first, second


def class_gaussians(counts: torch.Tensor, first: torch.Tensor, second: torch.Tensor):
    """mu_c and Sigma_c (Eqs. 3-4) from the summed client terms: mu_c = sum_k N_{c,k} mu_{c,k} / N_c and
    Sigma_c = (sum_k [(N_{c,k} - 1) Sigma_{c,k} + N_{c,k} mu_{c,k} mu_{c,k}^T] - N_c mu_c mu_c^T) / (N_c - 1),
    Eq. 4 with its three terms over the common denominator. A class with N_c < 2 has Sigma_c = 0; with
    N_c = 0, mu_c = 0 too (it is never sampled)."""
    n = counts.to(first.dtype)
    means = first / n.clamp(min=1)[:, None]
    outer = n[:, None, None] * means[:, :, None] * means[:, None, :]
    covs = (second - outer) / (n - 1).clamp(min=1)[:, None, None]
    covs[counts < 2] = 0.0
    return means, (covs + covs.transpose(1, 2)) / 2  # symmetric to the last bit (eigh reads one triangle)


def virtual_counts(counts: torch.Tensor, per_class: int, allocation: str) -> list[int]:
    """M_c for every class: M for each class seen in training (equal), or round(C M N_c / N), halves up
    (proportional: the classes' frequencies); 0 for a class no client holds."""
    n = [int(v) for v in counts.tolist()]
    if allocation == "equal":
        return [per_class if v > 0 else 0 for v in n]
    total, c = sum(n), len(n)
    return [(2 * c * per_class * v + total) // (2 * total) for v in n]


def sample_virtual(means: torch.Tensor, covs: torch.Tensor, m: list[int], generator: torch.Generator):
    """M_c draws from N(mu_c, Sigma_c) per class, in class order: mu_c + V_c diag(sqrt(max(lambda_c, 0))) g with
    Sigma_c = V_c diag(lambda_c) V_c^T and g standard normal (float64, from `generator`). Returns (features, labels)."""
    xs, ys = [], []
    for c, count in enumerate(m):
        if count == 0:
            continue
        values, vectors = torch.linalg.eigh(covs[c])
        root = vectors * values.clamp(min=0).sqrt()
        g = torch.randn(count, means.shape[1], dtype=torch.float64, generator=generator)
        xs.append(means[c] + g @ root.t())
        ys.append(torch.full((count,), c, dtype=torch.int64))
    return torch.cat(xs), torch.cat(ys)


def retrain_head(model, weight: torch.Tensor, bias: torch.Tensor | None, features: torch.Tensor,
                 labels: torch.Tensor, options, generator: torch.Generator):
    """SGD on a copy of the linear head (float32, CPU) over the virtual features, from its trained weights:
    options.retrain_epochs passes of mini-batches of options.retrain_batch_size in a fresh order drawn
    from `generator`, at options.retrain_lr with options.retrain_momentum, on the model's loss. Returns the
    new weight, bias and the mean loss of the last pass."""
    head = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    with torch.no_grad():
        head.weight.copy_(weight)
        if bias is not None:
            head.bias.copy_(bias)
    optimizer = torch.optim.SGD(head.parameters(), lr=options.retrain_lr, momentum=options.retrain_momentum)
    x = features.to(torch.float32)
    last = 0.0
    for _ in range(options.retrain_epochs):
        order = torch.randperm(len(labels), generator=generator)
        total = 0.0
        for start in range(0, len(order), options.retrain_batch_size):
            idx = order[start : start + options.retrain_batch_size]
            loss = model.loss(head(x[idx]), labels[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        last = total / len(order)
    return head.weight.detach(), (head.bias.detach() if bias is not None else None), last


def sample_seed(seed: int) -> int:
    """The seed of the virtual features and of the retraining's batch order."""
    return int(np.random.SeedSequence([seed, _SAMPLE_STREAM]).generate_state(1)[0])


class CCVRPhase(Phase):
    name = "ccvr"

    def run(self, context, logger) -> dict:
        cfg, ctx, options = context.cfg, context.ctx, context.cfg.calibration
        worker, model, c = context.worker, context.worker.module, context.data.num_classes
        if "head.weight" not in worker.param_slices:
            raise ConfigError("calibration.method=ccvr retrains a learnable linear head (model.head=linear; a plugin "
                              "model needs a `head` nn.Linear), which this model does not have")
        d = worker.module.head.weight.shape[1]
        t0 = time.perf_counter()
        acc_before, loss_before = context.evaluate()
        clients = calibration_clients(context)
        sizes = context.population.sizes

        # The fixed-point unit: every term is bounded by a client's samples times the largest feature squared.
        peak = torch.zeros(1, dtype=torch.float64, device=context.device)
        for _, idx in hosted_client_models(context, clients):
            z = client_features(model, context.data.train_x[idx], options.batch_size)
            if z.numel():
                peak = torch.maximum(peak, z.abs().max().reshape(1))
        dist.all_reduce_max(peak, ctx, name="ccvr_bound")
        peak = float(peak[0])
        largest = max(int(sizes[k]) for k in clients)
        upper = torch.triu_indices(d, d, device=context.device)
        stats = StatBuffer([Segment("counts", c, kind="int"),
                            Segment("first", c * d, bound=2 * largest * max(peak, 1.0), accumulate="int64"),
                            Segment("second", c * upper.shape[1], bound=2 * largest * max(peak, 1.0) ** 2,
                                    accumulate="int64")],
                           context.device, len(clients))
        t_features = time.perf_counter()
        for _, idx in hosted_client_models(context, clients):
            z = client_features(model, context.data.train_x[idx], options.batch_size)
            counts, means, covs = class_statistics(z, context.data.train_y[idx], c)
            first, second = client_terms(counts, means, covs)
            stats.add("counts", counts)
            stats.add("first", first)
            stats.add("second", second[:, upper[0], upper[1]])
        t_reduce = time.perf_counter()
        reduced = stats.reduce(ctx, name="ccvr")
        problems = reduced.problems()
        if problems:  # a NaN feature, or a bound that did not hold: never fit a Gaussian to a wrong sum
            raise RuntimeError(f"CCVR: the summed feature statistics are not exact ({problems})")
        t_fit = time.perf_counter()
        counts = reduced["counts"].cpu()
        second = torch.zeros(c, d, d, dtype=torch.float64)
        second[:, upper[0].cpu(), upper[1].cpu()] = reduced["second"].cpu().view(c, -1)
        second = second + second.triu(1).transpose(1, 2)
        means, covs = class_gaussians(counts, reduced["first"].cpu().view(c, d), second)

        generator = torch.Generator().manual_seed(sample_seed(cfg.seed))
        m = virtual_counts(counts, options.virtual_samples, options.virtual_allocation)
        features, labels = sample_virtual(means, covs, m, generator)
        w_slice = worker.param_slices["head.weight"]
        b_slice = worker.param_slices.get("head.bias")
        weight = context.global_params[w_slice].view(c, d).cpu()
        bias = context.global_params[b_slice].cpu() if b_slice is not None else None
        weight, bias, retrain_loss = retrain_head(model, weight, bias, features, labels, options, generator)
        context.global_params[w_slice] = weight.reshape(-1).to(context.global_params.device)
        if b_slice is not None:
            context.global_params[b_slice] = bias.to(context.global_params.device)
        fit_s = time.perf_counter() - t_fit

        after = evaluate_calibrated(context, self.name)
        acc_after = after["test_acc"]
        if ctx.is_main:
            checkpoint.atomic_torch_save({"counts": counts, "means": means, "covs": covs, "virtual": m,
                                          "clients": clients}, Path(context.run_dir) / STATS_FILE)
        seen = int((counts > 0).sum())
        result = {
            "test_acc_before": acc_before, "test_loss_before": loss_before,
            **after,
            "clients": len(clients), "samples": int(counts.sum()), "classes_seen": seen,
            "virtual_features": int(sum(m)), "retrain_loss": retrain_loss, "feature_peak": peak,
            "fixed_point_bits": min(stats.bits.values()), "features_s": t_reduce - t_features,
            "reduce_s": t_fit - t_reduce, "fit_s": fit_s, "total_s": time.perf_counter() - t0,
            "bytes_reduced": stats.nbytes,
        }
        if seen < c:
            logger.info(f"CCVR: {c - seen} of {c} classes have no training sample on the calibrated clients: "
                        "no virtual features for them")
        logger.info(f"CCVR on {len(clients)} clients, {result['samples']} samples, {result['virtual_features']} "
                    f"virtual features: test accuracy {100 * acc_before:.2f}% -> {100 * acc_after:.2f}%, "
                    f"{result['total_s']:.2f}s")
        log_result(logger, context, self.name, result)
        return result

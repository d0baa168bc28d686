"""Classifier heads: the learnable linear head, the fixed heads of SphereFed (Dong et al., ECCV 2022), and
MOON's projection head (Li, He, Song, CVPR 2021), which sits between the features and the head.

- `linear`: `nn.Linear(d, C)` with bias, trained like every other layer (the usual model).
- `sphere`: SphereFed's fixed classifier W (C x d) with orthonormal rows (Eq. 4, W W^T = I), built by
  QR of a Gaussian d x C matrix drawn from a recorded seed (the paper's App. D: "QR method is used"),
  applied to L2-normalised features (z = h / ||h||, Sec. 4.1) and trained against with MSE to one-hot
  targets (Eq. 5). No bias.
- `fixed_random`: the paper's "Fix (R)" comparison (FedBABU-like): a fixed He-initialised W (PyTorch's
  `nn.Linear` default), no bias, cross-entropy unless `model.loss` says otherwise.

A fixed head is a *buffer* of a module marked `frozen`: `FlatModel` keeps it out of the flat parameter
and buffer vectors, so it is never aggregated, never stepped by the optimizer, never decayed, and no
algorithm term (FedProx, SCAFFOLD, FedDyn, GMA, ...) sees it. It is still in the model's state_dict
(checkpoints, `model_sha256`), and FFC calibration may replace it after training.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
from torch import nn

from distfl.errors import ConfigError


class FixedHead(nn.Module):
    """z -> z W^T with W fixed (C x d, no bias)."""

    frozen = True  # FlatModel leaves this module's buffers out of the flat vectors

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", weight.to(torch.float32).contiguous())

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z @ self.weight.t()


def orthonormal_rows(num_classes: int, dim: int, seed: int) -> torch.Tensor:
    """C x d matrix with orthonormal rows: Q of the QR decomposition of a seeded N(0,1) d x C matrix, transposed.

    Computed in float64 on the CPU with its own generator, so it is the same on every rank and device.
    """
    if dim < num_classes:
        raise ConfigError(
            f"model.head=sphere needs feature dimension d >= number of classes C (C orthonormal rows in R^d), "
            f"but this model has d={dim} < C={num_classes}; use a wider model or model.head=fixed_random")
    gen = torch.Generator().manual_seed(int(seed))
    q, r = torch.linalg.qr(torch.randn(dim, num_classes, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r)).where(torch.diagonal(r) != 0, torch.ones(()))  # unique QR
    return q.t().contiguous()


def he_uniform(num_classes: int, dim: int, seed: int) -> torch.Tensor:
    """`nn.Linear(dim, num_classes).weight`'s default initialisation, drawn from a seeded generator."""
    gen = torch.Generator().manual_seed(int(seed))
    weight = torch.empty(num_classes, dim)
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5), generator=gen)
    return weight


def build_head(kind: str, dim: int, num_classes: int, seed: int) -> nn.Module:
    if kind == "linear":
        return nn.Linear(dim, num_classes)
    if kind == "sphere":
        return FixedHead(orthonormal_rows(num_classes, dim, seed))
    if kind == "fixed_random":
        return FixedHead(he_uniform(num_classes, dim, seed))
    raise ConfigError(f"model.head must be linear, sphere or fixed_random (got {kind!r})")


def projection_head(dim: int, out_dim: int) -> nn.Module:
    """MOON's projection head (its Sec. 3.1 and released code): Linear(d, d), ReLU, Linear(d, out_dim),
    no ReLU after the second layer. Drawn from the global RNG (PyTorch's default initialisation)."""
    return nn.Sequential(OrderedDict([("fc1", nn.Linear(dim, dim)), ("relu", nn.ReLU()),
                                      ("fc2", nn.Linear(dim, out_dim))]))


def orthonormality_error(weight: torch.Tensor) -> float:
    """max |W W^T - I|, in float64."""
    w = weight.detach().to(torch.float64).cpu()
    return float((w @ w.t() - torch.eye(w.shape[0], dtype=torch.float64)).abs().max())

"""Shared pieces of the model zoo: the `Classifier` wrapper and input-size checks.

Every model distfl builds is a `Classifier`: a feature extractor `features` (B x C x H x W -> B x d,
the penultimate activations after the last nonlinearity/pooling) followed by a linear `head`
(d -> num_classes, with bias). `forward(x)` is exactly `head(features(x))`, so algorithms that need
the representation (e.g. TCT, MOON-style losses, linear probing) can call the two parts separately.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from distfl.data.tokens import mean_token_loss, token_losses
from distfl.errors import ConfigError


class Classifier(nn.Module):
    """`head(features(x))` with `features: B x C x H x W -> B x feature_dim` and a linear head.

    `set_head` swaps in a fixed head (models/heads.py), turns on L2 feature normalisation and picks the
    loss (`loss`): what SphereFed changes. `represent(x)` is what the head sees.
    """

    def __init__(self, features: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.features = features
        self.feature_dim = int(feature_dim)
        self.num_classes = int(num_classes)
        self.head = nn.Linear(self.feature_dim, num_classes)
        self.feature_norm = False
        self.loss_kind = "ce"
        self.mse_reduction = "mean"

    def set_head(self, kind: str, seed: int, loss: str = "auto", feature_norm: str = "auto",
                 mse_reduction: str = "mean") -> None:
        from distfl.models.heads import build_head

        if kind != "linear":  # the linear head drawn in __init__ keeps the rest of the init unchanged
            self.head = build_head(kind, self.feature_dim, self.num_classes, seed).to(self.head.weight.device)
        self.feature_norm = feature_norm == "on" or (feature_norm == "auto" and kind == "sphere")
        self.loss_kind = loss if loss != "auto" else ("mse" if kind == "sphere" else "ce")
        self.mse_reduction = mse_reduction

    def set_projection(self, dim: int) -> None:
        """A projection head (MOON; models/heads.py) of `dim` outputs after the features, for dim > 0: it
        becomes the last layers of `features` (named `features.projection`), and a new linear head reads
        its `dim` outputs. What reads the features (the head, SphereFed's normalisation and fixed heads,
        FFC, TCT) then sees the projection's output, as in the paper's networks."""
        if dim <= 0:
            return
        from distfl.models.heads import projection_head

        features = self.features if isinstance(self.features, nn.Sequential) else nn.Sequential(self.features)
        features.add_module("projection", projection_head(self.feature_dim, dim))
        self.features, self.feature_dim = features, int(dim)
        self.head = nn.Linear(self.feature_dim, self.num_classes)

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        h = self.features(x)
        # eps: an all-zero post-ReLU feature maps to 0 instead of NaN.
        return F.normalize(h, dim=1, eps=1e-12) if self.feature_norm else h

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.represent(x))

    def loss(self, logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Cross-entropy, or squared error to one-hot targets (mean or sum over classes, then `reduction`
        over the batch)."""
        if self.loss_kind == "ce":
            return F.cross_entropy(logits, y, reduction=reduction)
        # One-hot by comparison, not F.one_hot: its in-place scatter cannot run under vmap (client packs).
        one_hot = y.unsqueeze(1) == torch.arange(logits.shape[1], device=y.device)
        per_class = (logits - one_hot.to(logits.dtype)) ** 2
        per_sample = per_class.mean(1) if self.mse_reduction == "mean" else per_class.sum(1)
        return per_sample.mean() if reduction == "mean" else per_sample.sum()


class TokenClassifier(Classifier):
    """A next-token model (data/tokens.py): `features` maps B x L tokens to B x L x feature_dim, the
    linear head reads every position, so the logits are B x L x V; the loss is the mean cross-entropy
    over the batch's non-padding targets. SphereFed's heads, feature normalisation and MOON's projection
    do not apply (build_model refuses them)."""

    per_token = True

    def loss(self, logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if reduction == "mean":
            return mean_token_loss(logits, y)
        return token_losses(logits, y)[0].sum()


class GlobalAvgPool(nn.Module):
    """Mean over H and W, flattened: what AdaptiveAvgPool2d(1) + Flatten compute, but its CUDA backward
    is deterministic (adaptive_avg_pool2d_backward_cuda has no deterministic kernel), so CNNs keep the
    bit-identity guarantee under runtime.deterministic=true."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def conv_out(size: int, kernel: int, stride: int = 1, padding: int = 0) -> int:
    """Output length of a convolution/pooling along one spatial dimension (floor mode)."""
    return (size + 2 * padding - kernel) // stride + 1


def min_input_size(out_size: Callable[[int], int], limit: int = 4096) -> int:
    """Smallest side length s for which `out_size(s) >= 1` (out_size is monotone in s)."""
    for s in range(1, limit + 1):
        if out_size(s) >= 1:
            return s
    raise ValueError("no valid input size found")  # pragma: no cover - only for broken stacks


def check_spatial(name: str, input_shape: tuple[int, int, int], out_size: Callable[[int], int]) -> tuple[int, int]:
    """Return the (h, w) a conv stack produces from `input_shape`, or raise ConfigError if it is empty.

    `out_size(side)` maps one input side length to the output side length of the whole stack.
    """
    _, h, w = input_shape
    oh, ow = out_size(h), out_size(w)
    if oh < 1 or ow < 1:
        m = min_input_size(out_size)
        raise ConfigError(
            f"model.name={name} needs inputs of at least {m}x{m} (got {h}x{w}); "
            f"use a larger data.synthetic_image_size or a model without that conv stack (e.g. model.name=mlp)"
        )
    return oh, ow

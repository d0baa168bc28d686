"""Shared pieces of the model zoo: the `Classifier` wrapper and input-size checks.

Every model distfl builds is a `Classifier`: a feature extractor `features` (B x C x H x W -> B x d,
the penultimate activations after the last nonlinearity/pooling) followed by a linear `head`
(d -> num_classes, with bias). `forward(x)` is exactly `head(features(x))`, so algorithms that need
the representation (e.g. TCT, MOON-style losses, linear probing) can call the two parts separately.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from distfl.errors import ConfigError


class Classifier(nn.Module):
    """`head(features(x))` with `features: B x C x H x W -> B x feature_dim` and a linear head."""

    def __init__(self, features: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.features = features
        self.feature_dim = int(feature_dim)
        self.head = nn.Linear(self.feature_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


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

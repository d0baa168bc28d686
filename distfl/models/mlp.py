"""MLP for fast tests on small (synthetic) images; not from any paper.

    flatten -> Linear(C*H*W -> h) ReLU -> Linear(h -> h) ReLU    [= features, d = h]
    -> head Linear(h -> num_classes)

h = model.mlp_hidden (default 64). Parameters for 1x8x8 inputs, h = 64, 10 classes: 8,970
(for 1x28x28: 55,050). PyTorch default initialisation.
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distfl.errors import ConfigError
from distfl.models.base import Classifier


def build_mlp(input_shape: tuple[int, int, int], num_classes: int, hidden: int) -> Classifier:
    if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
        raise ConfigError(f"model.mlp_hidden must be a positive integer (got {hidden!r})")
    c, h, w = input_shape
    features = nn.Sequential(OrderedDict([
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(c * h * w, hidden)),
        ("relu1", nn.ReLU()),
        ("fc2", nn.Linear(hidden, hidden)),
        ("relu2", nn.ReLU()),
    ]))
    return Classifier(features, hidden, num_classes)

"""LEAF's FEMNIST CNN (Caldas et al. 2018; TalwalkarLab/leaf models/femnist/cnn.py), also the model of
the FedProx and FedAvg-on-FEMNIST baselines:

    conv 5x5, 32, same padding, ReLU -> max-pool 2x2 / 2 -> conv 5x5, 64, same, ReLU -> max-pool 2x2 / 2
    -> flatten (7 x 7 x 64) -> Linear(3136 -> 2048) ReLU   [= features, d = 2048]
    -> head Linear(2048 -> num_classes)

Initialised as LEAF's TensorFlow layers: Glorot-uniform kernels, zero biases. Inputs 1 x 28 x 28 (the
flatten order is PyTorch's C x H x W, not TensorFlow's H x W x C: the same function class). Parameters
for 62 classes: 6,603,710.
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distfl.errors import ConfigError
from distfl.models.base import Classifier


def build_femnist_cnn(input_shape: tuple[int, int, int], num_classes: int) -> Classifier:
    c, h, w = input_shape
    if (h, w) != (28, 28):
        raise ConfigError(f"model.name=femnist_cnn takes 28 x 28 images (LEAF's FEMNIST), got {h} x {w}")
    features = nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(c, 32, 5, padding=2)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2, 2)),
        ("conv2", nn.Conv2d(32, 64, 5, padding=2)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2, 2)),
        ("flatten", nn.Flatten()),
        ("fc", nn.Linear(7 * 7 * 64, 2048)),
        ("relu3", nn.ReLU()),
    ]))
    model = Classifier(features, 2048, num_classes)
    for layer in model.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.xavier_uniform_(layer.weight)
            nn.init.zeros_(layer.bias)
    return model

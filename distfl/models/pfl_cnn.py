"""pfl_cnn: the simple CNN of pfl-research's CIFAR-10 cross-device benchmark, as the issue names it
(conv32-conv64-maxpool-fc128), for `distfl bench --suite cross-device`:

    Conv(C_in->32, 3x3) ReLU -> Conv(32->64, 3x3) ReLU -> MaxPool2 -> flatten
    -> FC(flat->128) ReLU                                   [= features, d = 128]
    -> head FC(128->num_classes)

flat = 64 * ((H-4)/2) * ((W-4)/2): 12,544 for 3x32x32. Parameters: 1,626,442 for 3x32x32 with 10
classes. No padding, so inputs must be at least 6x6. PyTorch default initialisation.
Our choice: no dropout (the Keras-style original has dropout after the pool and after fc128; distfl's
models have none, so every client's step stays a pure function of its keyed batch order).
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distfl.models.base import Classifier, check_spatial, conv_out


def _out_side(s: int) -> int:
    return conv_out(conv_out(conv_out(s, 3), 3), 2, 2)


def build_pfl_cnn(input_shape: tuple[int, int, int], num_classes: int) -> Classifier:
    c = input_shape[0]
    oh, ow = check_spatial("pfl_cnn", input_shape, _out_side)
    features = nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(c, 32, 3)),
        ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(32, 64, 3)),
        ("relu2", nn.ReLU()),
        ("pool", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(64 * oh * ow, 128)),
        ("relu3", nn.ReLU()),
    ]))
    return Classifier(features, 128, num_classes)

"""CIFAR CNN of FedADC (Ozfatura et al., fedadc.md §3.1): "4 convolutional layers + 4 fully connected
layers, no batch normalization, max-pooling to downscale".

The paper states only that structure; the channel widths, kernel sizes and FC widths below are OUR
choice (a common VGG-like small CIFAR net), not the paper's:

    Conv(C_in->32, 3x3, pad 1) ReLU -> Conv(32->32, 3x3, pad 1) ReLU -> MaxPool2
    -> Conv(32->64, 3x3, pad 1) ReLU -> Conv(64->64, 3x3, pad 1) ReLU -> MaxPool2 -> flatten
    -> FC(flat->256) ReLU -> FC(256->128) ReLU -> FC(128->64) ReLU      [= features, d = 64]
    -> head FC(64->num_classes)                                          (4th FC layer)

flat = 64 * (H/4) * (W/4): 4096 for 3x32x32, 3136 for 1x28x28. No dropout.
Parameters: 1,156,202 for 3x32x32 with 10 classes (909,866 for 1x28x28 with 10 classes).
Inputs must be at least 4x4. PyTorch default initialisation.
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distfl.models.base import Classifier, check_spatial, conv_out


def _out_side(s: int) -> int:
    return conv_out(conv_out(s, 2, 2), 2, 2)  # the 3x3/pad-1 convs keep the size


def build_cifar_cnn(input_shape: tuple[int, int, int], num_classes: int) -> Classifier:
    c, _, _ = input_shape
    oh, ow = check_spatial("cifar_cnn", input_shape, _out_side)
    flat = 64 * oh * ow
    features = nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(c, 32, 3, padding=1)),
        ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(32, 32, 3, padding=1)),
        ("relu2", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2)),
        ("conv3", nn.Conv2d(32, 64, 3, padding=1)),
        ("relu3", nn.ReLU()),
        ("conv4", nn.Conv2d(64, 64, 3, padding=1)),
        ("relu4", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(flat, 256)),
        ("relu5", nn.ReLU()),
        ("fc2", nn.Linear(256, 128)),
        ("relu6", nn.ReLU()),
        ("fc3", nn.Linear(128, 64)),
        ("relu7", nn.ReLU()),
    ]))
    return Classifier(features, 64, num_classes)

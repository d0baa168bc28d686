"""ResNet-18 with the CIFAR stem, the CIFAR-10/100 model of TCT (Yu et al., §2.2 of tct.md) and of
FedADC's CIFAR-100 runs.

Layout (the widely used "kuangliu" CIFAR variant of He et al. 2016):

    conv3x3(C_in->64, stride 1) + norm + ReLU       (no 7x7 conv, no max-pool)
    -> 4 stages of 2 BasicBlocks: widths 64, 128, 256, 512; strides 1, 2, 2, 2
       BasicBlock: conv3x3-norm-ReLU-conv3x3-norm, + shortcut, ReLU
       shortcut: identity, or 1x1 conv (stride s, no bias) + norm when the shape changes
    -> adaptive average pool -> flatten                [= features, d = 512]
    -> head Linear(512->num_classes)

norm is BatchNorm2d (model.norm=bn, "ResNet-18-BN", the default) or GroupNorm(model.gn_groups,
channels) (model.norm=gn, "ResNet-18-GN", TCT uses num_groups = 2). Convolutions have no bias.
Parameters for 3x32x32: 11,173,962 with 10 classes, 11,220,132 with 100 classes (the same for BN
and GN: both have a per-channel affine weight and bias). Any input size >= 1x1 works (the pool is
adaptive). PyTorch default initialisation (norm layers: weight 1, bias 0).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable

import torch
from torch import nn

from distfl.errors import ConfigError
from distfl.models.base import Classifier, GlobalAvgPool

NormFactory = Callable[[int], nn.Module]


def make_norm(norm: str, gn_groups: int) -> NormFactory:
    """Return channels -> normalisation layer for model.norm / model.gn_groups."""
    if norm == "bn":
        return nn.BatchNorm2d
    if norm == "gn":
        if not isinstance(gn_groups, int) or isinstance(gn_groups, bool) or gn_groups < 1 or 64 % gn_groups:
            raise ConfigError(
                f"model.gn_groups must be a positive divisor of 64 (every ResNet-18 width is a multiple "
                f"of 64), e.g. 1, 2, 4, 8, 16, 32 or 64 (got {gn_groups!r})"
            )
        return lambda channels: nn.GroupNorm(gn_groups, channels)
    raise ConfigError(f"model.norm must be one of bn, gn (got {norm!r})")


def projection_shortcut(in_planes: int, planes: int, stride: int, norm: NormFactory) -> nn.Module:
    """Option B: 1x1 conv (stride s, no bias) + norm."""
    return nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False), norm(planes))


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection; `shortcut` builds the path used when the shape changes."""

    def __init__(self, in_planes: int, planes: int, stride: int, norm: NormFactory,
                 shortcut=projection_shortcut):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = norm(planes)
        self.relu = nn.ReLU()
        if stride != 1 or in_planes != planes:
            self.shortcut = shortcut(in_planes, planes, stride, norm)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def build_resnet18(input_shape: tuple[int, int, int], num_classes: int, norm: str = "bn",
                   gn_groups: int = 2, block=None) -> Classifier:
    """`block`: the residual block class (default BasicBlock; SENet18 passes its SE block)."""
    block = BasicBlock if block is None else block
    c, _, _ = input_shape
    norm_layer = make_norm(norm, gn_groups)
    layers: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(c, 64, 3, stride=1, padding=1, bias=False)),
        ("bn1", norm_layer(64)),
        ("relu", nn.ReLU()),
    ]
    in_planes = 64
    for i, (planes, stride) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], start=1):
        blocks = []
        for s in (stride, 1):
            blocks.append(block(in_planes, planes, s, norm_layer))
            in_planes = planes
        layers.append((f"layer{i}", nn.Sequential(*blocks)))
    layers += [("pool", GlobalAvgPool())]
    return Classifier(nn.Sequential(OrderedDict(layers)), 512, num_classes)

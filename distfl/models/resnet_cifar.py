"""ResNet-20 for CIFAR (He et al. 2016, §4.2), the model of FedFOR (fedfor.md: "the proper ResNet
implementation for CIFAR10", i.e. the akamaster pytorch_resnet_cifar10 style). Written from the
paper's description:

    conv3x3(C_in->16) + BN + ReLU
    -> 3 stages of 3 BasicBlocks: widths 16, 32, 64; strides 1, 2, 2
       BasicBlock: conv3x3-BN-ReLU-conv3x3-BN, + shortcut, ReLU
       shortcut "option A": identity, or (when the shape changes) stride-2 subsampling x[:, :, ::2, ::2]
       plus zero-padding of the new channels (planes/4 on each side) -- parameter-free
    -> global average pool -> flatten                   [= features, d = 64]
    -> head Linear(64->num_classes)

Parameters for 3x32x32: 269,722 with 10 classes (fedfor.md computes the same), 275,572 with 100
classes. (A 1x1-conv + BN "option B" shortcut would give 272,474; we follow option A as FedFOR's
reference does.) Convolutions have no bias. Initialisation as in the reference: Kaiming-normal
(fan_in, ReLU gain) for conv and linear weights, PyTorch defaults otherwise.
Any input size >= 1x1 works (the pool is adaptive).
"""
from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from distfl.models.base import Classifier, GlobalAvgPool
from distfl.models.resnet import BasicBlock


class PadShortcut(nn.Module):
    """Option-A shortcut: subsample spatially by `stride` and zero-pad channels in_planes -> planes."""

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.stride = stride
        extra = planes - in_planes
        self.pad_before = extra // 2
        self.pad_after = extra - extra // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, self.pad_before, self.pad_after))


def pad_shortcut(in_planes: int, planes: int, stride: int, norm) -> nn.Module:
    return PadShortcut(in_planes, planes, stride)


def build_resnet20(input_shape: tuple[int, int, int], num_classes: int) -> Classifier:
    c, _, _ = input_shape
    layers: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(c, 16, 3, stride=1, padding=1, bias=False)),
        ("bn1", nn.BatchNorm2d(16)),
        ("relu", nn.ReLU()),
    ]
    in_planes = 16
    for i, (planes, stride) in enumerate([(16, 1), (32, 2), (64, 2)], start=1):
        blocks = []
        for s in (stride, 1, 1):
            blocks.append(BasicBlock(in_planes, planes, s, nn.BatchNorm2d, shortcut=pad_shortcut))
            in_planes = planes
        layers.append((f"layer{i}", nn.Sequential(*blocks)))
    layers += [("pool", GlobalAvgPool())]
    model = Classifier(nn.Sequential(OrderedDict(layers)), 64, num_classes)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight)
    return model

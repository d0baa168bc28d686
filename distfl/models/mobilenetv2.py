"""MobileNetV2 for CIFAR, the FedAvg model of SphereFed (Dong et al., ECCV 2022; spherefed.md §2.4, the
paper's Tab. 14; Sandler et al., CVPR 2018).

Layout:

    Conv3x3(C_in -> 32, stride 1, pad 1, no bias) + norm + ReLU6          (CIFAR stem: stride 1)
    -> inverted residual blocks, stage schedule (t = expansion, c = out channels, n = blocks, s = stride
       of the stage's first block; the other blocks have stride 1):
         (1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
         (6, 320, 1, 1)                                                     (17 blocks, total stride 8)
       block(in -> out, t, s), hidden = t * in:
         Conv1x1(in -> hidden) + norm + ReLU6                    (expand)
         Conv3x3(hidden -> hidden, stride s, pad 1, groups = hidden) + norm + ReLU6   (depthwise)
         Conv1x1(hidden -> out) + norm                           (project; linear, no activation)
         + x when s = 1 and in = out                             (residual)
    -> Conv1x1(320 -> 1280) + norm + ReLU6 -> adaptive average pool -> flatten   [= features, d = 1280]
    -> head Linear(1280 -> num_classes)

All convolutions have no bias.

Choices the paper leaves open or states differently, and what we do:

- Activations: the table shows plain ReLU, also after the projection conv. We use the standard MobileNetV2
  block of Sandler et al. instead: ReLU6 after the stem, expand and depthwise convs and the last 1x1 conv,
  and a linear bottleneck (no activation after the projection).
- Residuals: not drawn in the table; we add the identity exactly when stride = 1 and in = out (Sandler et
  al.; no projection shortcuts).
- Expansion conv when t = 1: the table gives every block a 1x1 expand conv, so the first block keeps a
  1x1 conv 32 -> 32 (+ norm + ReLU6); torchvision's ImageNet model omits it.
- Stage 2 stride is TIN_S = 1 for CIFAR (2 for TinyImageNet, not implemented here; the adaptive pool
  accepts 64x64 inputs as they are).
- Final pooling: the paper's AvgPool2d(k=4) assumes 32x32 input; we pool adaptively, so any input of at
  least 1x1 works (every strided conv is 3x3 with pad 1) and d = 1280 always. There is therefore no
  too-small input beyond the 1x1 that build_model already requires.
- Norm layer: SphereFed uses BatchNorm for MobileNetV2 on CIFAR-100 (model.norm=bn). model.norm=gn gives
  GroupNorm(model.gn_groups, channels); gn_groups must divide every width, i.e. be 1, 2, 4 or 8.
- The paper's classifier has no bias; distfl's linear head has one (model.head=sphere has none).

Parameters for 3x32x32 (the same for BN and GN): 2,353,060 with 100 classes, 2,237,770 with 10 classes.
No dropout, no in-place activations, PyTorch default initialisation.
"""
from __future__ import annotations

import math
from collections import OrderedDict
from functools import reduce

import torch
from torch import nn

from distfl.errors import ConfigError
from distfl.models.base import Classifier, GlobalAvgPool
from distfl.models.resnet import NormFactory, make_norm

STEM_WIDTH = 32
LAST_WIDTH = 1280
# (expansion t, output channels c, blocks n, first stride s)
STAGES: list[tuple[int, int, int, int]] = [
    (1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1),
]


def _widths() -> list[int]:
    """Every channel count a norm layer sees."""
    widths, in_ch = [STEM_WIDTH, LAST_WIDTH], STEM_WIDTH
    for t, c, n, _ in STAGES:
        for _ in range(n):
            widths += [t * in_ch, c]
            in_ch = c
    return widths


WIDTH_GCD = reduce(math.gcd, _widths())  # 8


class InvertedResidual(nn.Module):
    """1x1 expand -> 3x3 depthwise -> 1x1 linear projection, + x when the shape is unchanged."""

    def __init__(self, in_ch: int, out_ch: int, expansion: int, stride: int, norm: NormFactory):
        super().__init__()
        hidden = expansion * in_ch
        self.expand = nn.Conv2d(in_ch, hidden, 1, bias=False)
        self.bn1 = norm(hidden)
        self.act1 = nn.ReLU6()
        self.depthwise = nn.Conv2d(hidden, hidden, 3, stride=stride, padding=1, groups=hidden, bias=False)
        self.bn2 = norm(hidden)
        self.act2 = nn.ReLU6()
        self.project = nn.Conv2d(hidden, out_ch, 1, bias=False)
        self.bn3 = norm(out_ch)
        self.use_residual = stride == 1 and in_ch == out_ch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.bn1(self.expand(x)))
        out = self.act2(self.bn2(self.depthwise(out)))
        out = self.bn3(self.project(out))
        return out + x if self.use_residual else out


def build_mobilenetv2(input_shape: tuple[int, int, int], num_classes: int, norm: str = "bn",
                      gn_groups: int = 2) -> Classifier:
    c, _, _ = input_shape
    if norm == "gn" and (not isinstance(gn_groups, int) or isinstance(gn_groups, bool) or gn_groups < 1
                         or WIDTH_GCD % gn_groups):
        divisors = ", ".join(str(g) for g in range(1, WIDTH_GCD + 1) if WIDTH_GCD % g == 0)
        raise ConfigError(
            f"model.gn_groups must divide every MobileNetV2 width (their gcd is {WIDTH_GCD}): one of "
            f"{divisors} (got {gn_groups!r})"
        )
    norm_layer = make_norm(norm, gn_groups)
    layers: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(c, STEM_WIDTH, 3, stride=1, padding=1, bias=False)),
        ("bn1", norm_layer(STEM_WIDTH)),
        ("relu1", nn.ReLU6()),
    ]
    in_ch = STEM_WIDTH
    for i, (t, out_ch, n, s) in enumerate(STAGES, start=1):
        blocks = []
        for j in range(n):
            blocks.append(InvertedResidual(in_ch, out_ch, t, s if j == 0 else 1, norm_layer))
            in_ch = out_ch
        layers.append((f"stage{i}", nn.Sequential(*blocks)))
    layers += [
        ("conv2", nn.Conv2d(in_ch, LAST_WIDTH, 1, bias=False)),
        ("bn2", norm_layer(LAST_WIDTH)),
        ("relu2", nn.ReLU6()),
        ("pool", GlobalAvgPool()),
    ]
    return Classifier(nn.Sequential(OrderedDict(layers)), LAST_WIDTH, num_classes)

"""SENet18 for CIFAR, the FedOpt model of SphereFed (Dong et al., ECCV 2022; spherefed.md §2.4, the paper's
Tab. 13): ResNet-18 with the CIFAR stem whose BasicBlocks carry a Squeeze-and-Excitation module
(Hu et al., CVPR 2018).

Layout:

    conv3x3(C_in -> 64, stride 1, pad 1, no bias) + norm + ReLU      (no 7x7 conv, no max-pool)
    -> 4 stages of 2 SE-BasicBlocks: widths 64, 128, 256, 512; first-block strides 1, 2, 2, 2
       SE-BasicBlock: r = conv3x3-norm-ReLU-conv3x3-norm; r = r * SE(r); out = ReLU(r + shortcut(x))
       SE(r): global average pool -> Linear(c -> c // 16) -> ReLU -> Linear(c // 16 -> c) -> sigmoid,
              one weight per channel of the residual branch (applied before the shortcut add)
       shortcut: identity, or 1x1 conv (stride s, no bias) + norm when the shape changes
    -> adaptive average pool -> flatten                                [= features, d = 512]
    -> head Linear(512 -> num_classes)

The stem, blocks and shortcuts are distfl.models.resnet's (ResNet-18, `make_norm`, `BasicBlock`,
`projection_shortcut`); only the SE module is new.

Choices the paper leaves open, and what we do:

- SE reduction ratio: not stated; we use 16 (Hu et al.'s default). The two SE FCs have biases.
- Residual shortcuts: not drawn but implied; we use ResNet-18's (identity, or 1x1 conv + norm).
- Final pooling: the paper's AvgPool2d(k=4) assumes 32x32 input; we pool adaptively, so any input of at
  least 1x1 works and d = 512 always (identical to the paper's for 32x32). There is therefore no
  too-small input beyond the 1x1 that build_model already requires.
- Norm layer: SphereFed uses GroupNorm for SENet18 (model.norm=gn); the number of groups is not stated
  (model.gn_groups, any divisor of 64; our configs use 2). model.norm=bn gives BatchNorm2d. The SE module
  has no norm layer.
- The paper's classifier has no bias; distfl's linear head has one (model.head=sphere has none).

Parameters for 3x32x32 (the same for BN and GN): 11,309,212 with 100 classes, 11,263,042 with 10
classes. No dropout, no in-place activations, PyTorch default initialisation.
"""
from __future__ import annotations

import torch
from torch import nn

from distfl.models.base import Classifier
from distfl.models.resnet import BasicBlock, NormFactory, build_resnet18

SE_REDUCTION = 16


class SqueezeExcitation(nn.Module):
    """x -> per-channel gates in (0, 1): sigmoid(fc2(ReLU(fc1(mean over H, W of x)))), shape B x C x 1 x 1."""

    def __init__(self, channels: int, reduction: int = SE_REDUCTION):
        super().__init__()
        hidden = max(1, channels // reduction)
        self.fc1 = nn.Linear(channels, hidden)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(hidden, channels)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.mean(dim=(2, 3))
        w = self.sigmoid(self.fc2(self.relu(self.fc1(s))))
        return w[:, :, None, None]


class SEBasicBlock(BasicBlock):
    """ResNet's BasicBlock with the residual branch rescaled by a Squeeze-and-Excitation gate."""

    def __init__(self, in_planes: int, planes: int, stride: int, norm: NormFactory):
        super().__init__(in_planes, planes, stride, norm)
        self.se = SqueezeExcitation(planes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out * self.se(out)
        return self.relu(out + self.shortcut(x))


def build_senet18(input_shape: tuple[int, int, int], num_classes: int, norm: str = "bn",
                  gn_groups: int = 2) -> Classifier:
    """ResNet-18's layout (distfl/models/resnet.py) with SE blocks."""
    return build_resnet18(input_shape, num_classes, norm, gn_groups, block=SEBasicBlock)

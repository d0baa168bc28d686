"""VGG13 for CIFAR, the FedNova model of SphereFed (Dong et al., ECCV 2022; spherefed.md §2.4, the paper's
Tab. 12, which follows kuangliu/pytorch-cifar's vgg.py).

Layout (kuangliu's VGG13 config `[64, 64, M, 128, 128, M, 256, 256, M, 512, 512, M, 512, 512, M]`):

    10 x [Conv3x3(stride 1, pad 1, with bias) + norm + ReLU], a 2x2/stride-2 max-pool after every pair
    -> adaptive average pool to 1x1 -> flatten                  [= features, d = 512]
    -> head Linear(512 -> num_classes)

Choices the paper leaves open or gets wrong, and what we do:

- Number of max-pools: the table as transcribed has only 4 (a 2x2x512 = 2048-d output for 32x32 input,
  contradicting its own FC(512, 100)). We follow kuangliu's 5 pools (spherefed.md §2.4 [impl-note]).
- Final pooling: the paper has MaxPool2d(k=TIN_S) -> AvgPool2d(k=1), i.e. a stack tuned to 32x32 (CIFAR)
  or 64x64 (TinyImageNet). We use a global (adaptive) average pool instead, so every input of at least
  32x32 gives d = 512 (for 32x32 it is the identity on the 1x1 map, exactly kuangliu's model).
- Norm layer: the paper's "NormLayer(256)" after 512-channel convs is a typo; every norm has the conv's
  width. SphereFed uses GroupNorm for VGG13 (model.norm=gn); the number of groups is not stated
  (model.gn_groups, any divisor of 64; our configs use 2). model.norm=bn gives BatchNorm2d.
- Conv bias: kept (PyTorch's default, as in kuangliu), although a following norm makes it redundant.
- The paper's classifier has no bias; distfl's linear head has one (model.head=sphere has none).

Parameters for 3x32x32 (the same for BN and GN: both have a per-channel affine weight and bias):
9,462,180 with 100 classes, 9,416,010 with 10 classes. Inputs must be at least 32x32 (five floor-mode
2x2 pools). No dropout, no in-place activations, PyTorch default initialisation.
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distfl.models.base import Classifier, GlobalAvgPool, check_spatial, conv_out
from distfl.models.resnet import make_norm

VGG13_CFG: list[int | str] = [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


def _out_side(s: int) -> int:
    for v in VGG13_CFG:
        if v == "M":
            s = conv_out(s, 2, 2)  # the 3x3/pad-1 convs keep the size
    return s


def build_vgg13(input_shape: tuple[int, int, int], num_classes: int, norm: str = "bn",
                gn_groups: int = 2) -> Classifier:
    c, _, _ = input_shape
    norm_layer = make_norm(norm, gn_groups)
    check_spatial("vgg13", input_shape, _out_side)
    layers: list[tuple[str, nn.Module]] = []
    in_ch, conv_i, pool_i = c, 0, 0
    for v in VGG13_CFG:
        if v == "M":
            pool_i += 1
            layers.append((f"pool{pool_i}", nn.MaxPool2d(2, 2)))
        else:
            conv_i += 1
            layers += [
                (f"conv{conv_i}", nn.Conv2d(in_ch, int(v), 3, stride=1, padding=1)),
                (f"norm{conv_i}", norm_layer(int(v))),
                (f"relu{conv_i}", nn.ReLU()),
            ]
            in_ch = int(v)
    layers += [("gap", GlobalAvgPool())]
    return Classifier(nn.Sequential(OrderedDict(layers)), 512, num_classes)

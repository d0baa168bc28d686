"""tct_cnn: TCT's Fashion-MNIST network as its paper describes it (Yu et al., §2.2 of tct.md): "a
convolutional neural network with ReLU activations consisting of two convolutional layers with max pooling
followed by two fully connected layers". The paper gives no widths; it keeps p = 100,000 eNTK coordinates
"in all experiments", so the network has more than 100,000 parameters. Our widths follow the authors'
public MNIST net (conv 32 and 64 channels, FC hidden 128; reference-code.md):

    Conv(C_in->32, 5x5, pad 2) ReLU MaxPool2 -> Conv(32->64, 5x5, pad 2) ReLU MaxPool2 -> flatten
    -> FC(64*7*7->128) ReLU                      [= features, d = 128]
    -> head FC(128->num_classes)

Parameters for 1x28x28 and 10 classes: 832 + 51,264 + 401,536 + 1,290 = 454,922 (453,761 with the
1-output head TCT's eNTK uses), against 356,234 for the authors' MNIST net (three stride-2 3x3 convs,
FC 2048->128->C, no pooling). NIID-Bench's SimpleCNN (`simplecnn`) has 44,426: fewer than p, so its
stage-2 model cannot interpolate 60,000 samples. PyTorch default initialisation.
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distfl.models.base import Classifier, check_spatial, conv_out


def build_tct_cnn(input_shape: tuple[int, int, int], num_classes: int) -> Classifier:
    def out_side(s: int) -> int:
        return conv_out(conv_out(s, 2, 2), 2, 2)  # the 5x5 convs keep the size (pad 2); two 2x2 pools halve it

    oh, ow = check_spatial("tct_cnn", input_shape, out_side)
    features = nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(input_shape[0], 32, 5, padding=2)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(32, 64, 5, padding=2)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(64 * oh * ow, 128)),
        ("relu3", nn.ReLU()),
    ]))
    return Classifier(features, 128, num_classes)

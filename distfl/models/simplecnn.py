"""SimpleCNN: NIID-Bench's `SimpleCNNMNIST` (Li et al., "Federated Learning on Non-IID Data Silos:
An Experimental Study", ICDE 2022), the FMNIST model of TCT (Yu et al., §2.2 of tct.md).

    Conv(C_in->6, 5x5) ReLU MaxPool2 -> Conv(6->16, 5x5) ReLU MaxPool2 -> flatten
    -> FC(flat->120) ReLU -> FC(120->84) ReLU            [= features, d = 84]
    -> head FC(84->num_classes)

`flat` is computed from the input shape: 16*4*4 = 256 for 1x28x28, 16*5*5 = 400 for 3x32x32.
Parameters: 44,426 for 1x28x28 with 10 classes (62,006 for 3x32x32 with 10 classes).
No padding, so inputs must be at least 16x16. PyTorch default initialisation.
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distfl.models.base import Classifier, check_spatial, conv_out



def lenet_style_cnn(name: str, input_shape: tuple[int, int, int], num_classes: int, pad: int = 0) -> Classifier:
    """Conv(5x5, 6) ReLU MaxPool2 -> Conv(5x5, 16) ReLU MaxPool2 -> FC 120 -> FC 84 -> head."""
    c = input_shape[0]

    def out_side(s: int) -> int:
        s = conv_out(s, 5, 1, pad)  # conv1
        s = conv_out(s, 2, 2)  # pool
        s = conv_out(s, 5)  # conv2
        return conv_out(s, 2, 2)  # pool

    oh, ow = check_spatial(name, input_shape, out_side)
    features = nn.Sequential(OrderedDict([
        ("conv1", nn.Conv2d(c, 6, 5, padding=pad)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(6, 16, 5)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
        ("fc1", nn.Linear(16 * oh * ow, 120)),
        ("relu3", nn.ReLU()),
        ("fc2", nn.Linear(120, 84)),
        ("relu4", nn.ReLU()),
    ]))
    return Classifier(features, 84, num_classes)


def build_simplecnn(input_shape: tuple[int, int, int], num_classes: int) -> Classifier:
    return lenet_style_cnn("simplecnn", input_shape, num_classes)

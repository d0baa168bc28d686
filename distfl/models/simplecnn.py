"""SimpleCNN: NIID-Bench's `SimpleCNNMNIST` (Li et al., "Federated Learning on Non-IID Data Silos:
An Experimental Study", ICDE 2022), the FMNIST model of TCT (Yu et al., §2.2 of tct.md).

    Conv(C_in->6, 5x5) ReLU MaxPool2 -> Conv(6->16, 5x5) ReLU MaxPool2 -> flatten
    -> FC(flat->120) ReLU -> FC(120->84) ReLU            [= features, d = 84]
    -> head FC(84->num_classes)

`flat` is computed from the input shape: 16*4*4 = 256 for 1x28x28, 16*5*5 = 400 for 3x32x32.
Parameters: 44,426 for 1x28x28 with 10 classes (62,006 for 3x32x32 with 10 classes).

`model.feature_dim = d > 0` (our option, not NIID-Bench's) widens the feature layer: FC(flat->max(120, d))
ReLU -> FC(max(120, d)->d) ReLU -> head FC(d->num_classes). d = 256 gives 136,726 parameters (1x28x28, 10
classes). 0 keeps the layers above, drawn from the RNG in the same order.
No padding, so inputs must be at least 16x16. PyTorch default initialisation.
"""
from __future__ import annotations

from collections import OrderedDict

from torch import nn

from distfl.models.base import Classifier, check_spatial, conv_out



def lenet_style_cnn(name: str, input_shape: tuple[int, int, int], num_classes: int, pad: int = 0,
                    feature_dim: int = 84) -> Classifier:
    """Conv(5x5, 6) ReLU MaxPool2 -> Conv(5x5, 16) ReLU MaxPool2 -> FC max(120, d) -> FC d -> head (d = 84)."""
    c = input_shape[0]
    hidden = max(120, feature_dim)

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
        ("fc1", nn.Linear(16 * oh * ow, hidden)),
        ("relu3", nn.ReLU()),
        ("fc2", nn.Linear(hidden, feature_dim)),
        ("relu4", nn.ReLU()),
    ]))
    return Classifier(features, feature_dim, num_classes)


def build_simplecnn(input_shape: tuple[int, int, int], num_classes: int, feature_dim: int = 0) -> Classifier:
    """SimpleCNN; `feature_dim` > 0 sets the width d of the feature layer (0: NIID-Bench's 84)."""
    return lenet_style_cnn("simplecnn", input_shape, num_classes, feature_dim=feature_dim or 84)

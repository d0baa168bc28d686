"""LeNet-5 (LeCun et al. 1998), the model GMA (gma.md) uses for MNIST/FMNIST/FEMNIST/FedCMNIST.

GMA does not state the layers, so this is the classic LeNet-5 layout with the modern substitutions
ReLU (for tanh) and max-pooling (for subsampling):

    Conv(C_in->6, 5x5, pad 2 if the input is 28x28 else 0) ReLU MaxPool2
    -> Conv(6->16, 5x5) ReLU MaxPool2 -> flatten (16*5*5 = 400 for 28x28 and 32x32)
    -> FC(400->120) ReLU -> FC(120->84) ReLU             [= features, d = 84]
    -> head FC(84->num_classes)

The padding of 2 on 28x28 inputs reproduces the original 32x32 geometry. For other sizes the flat
width is computed from the input shape; unpadded inputs must be at least 16x16.
Parameters: 61,706 for 1x28x28 with 10 classes, 62,006 for 3x32x32 with 10 classes.
PyTorch default initialisation.
"""
from __future__ import annotations

from distfl.models.base import Classifier
from distfl.models.simplecnn import lenet_style_cnn


def build_lenet5(input_shape: tuple[int, int, int], num_classes: int) -> Classifier:
    pad = 2 if tuple(input_shape[1:]) == (28, 28) else 0
    return lenet_style_cnn("lenet5", input_shape, num_classes, pad)

"""Multinomial logistic regression, the model of FedProx's synthetic experiments (Li et al., MLSys 2020;
the authors' flearn/models/synthetic/mclr.py): one dense layer from the flattened input to the classes,
softmax cross-entropy.

    flatten (C*H*W = d)  [= features]  -> head Linear(d -> num_classes)

Initialised as TensorFlow's dense layer (what the authors' model uses): Glorot-uniform weights, zero bias.
Their layer declares an L2 regulariser (0.001) that their loss never adds, so none is added here either.
Parameters for FedProx's 60 features and 10 classes: 610.
"""
from __future__ import annotations

from torch import nn

from distfl.models.base import Classifier


def build_mclr(input_shape: tuple[int, int, int], num_classes: int) -> Classifier:
    c, h, w = input_shape
    model = Classifier(nn.Flatten(), c * h * w, num_classes)
    nn.init.xavier_uniform_(model.head.weight)
    nn.init.zeros_(model.head.bias)
    return model

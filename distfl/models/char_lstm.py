"""LEAF's Shakespeare character LSTM (Caldas et al. 2018; TalwalkarLab/leaf models/shakespeare/
stacked_lstm.py; also FedProx's and McMahan et al.'s Shakespeare model): predict the next character of an
80-character sequence.

    embedding (80 characters -> 8) -> 2 stacked LSTM layers of 256 -> the last step's output
    [= features, d = 256] -> head Linear(256 -> num_classes)

The LSTM is written out as its cell equations (gates i, f, g, o from one Linear of the input and one of
the hidden state, c' = f c + i g, h' = o tanh(c')), so that torch.func can vectorise it over a pack of
clients (runtime.pack_size); LEAF's TensorFlow BasicLSTMCell adds forget_bias = 1 to the forget gate's
pre-activation, and so does this. Initialisation: PyTorch's (nn.Embedding N(0, 1), nn.Linear uniform).
Inputs: int64 character indices, B x L. Parameters for 80 classes: 817,872 (as the TensorFlow model: one bias per layer).
"""
from __future__ import annotations

import torch
from torch import nn

from distfl.models.base import Classifier

EMBEDDING = 8
HIDDEN = 256
LAYERS = 2
FORGET_BIAS = 1.0  # TensorFlow's BasicLSTMCell default


class CellLSTM(nn.Module):
    """Stacked LSTM layers over B x L x in, returning the last step's hidden state of the top layer
    (`every_step`: the top layer's hidden state at every step, B x L x hidden). `forget_bias` is added
    to the forget gate's pre-activation (TensorFlow's BasicLSTMCell; Keras's LSTM instead starts the
    forget gate's bias at 1 and adds nothing: `forget_bias=0`, see models/token_lstm.py)."""

    def __init__(self, inputs: int, hidden: int, layers: int, every_step: bool = False,
                 forget_bias: float = FORGET_BIAS):
        super().__init__()
        self.hidden = hidden
        self.every_step = every_step
        self.forget_bias = forget_bias
        self.input_maps = nn.ModuleList(nn.Linear(inputs if k == 0 else hidden, 4 * hidden) for k in range(layers))
        self.hidden_maps = nn.ModuleList(nn.Linear(hidden, 4 * hidden, bias=False) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sequence = x
        for input_map, hidden_map in zip(self.input_maps, self.hidden_maps):
            projected = input_map(sequence)  # B x L x 4H, all steps at once
            h = sequence.new_zeros(sequence.shape[0], self.hidden)
            c = torch.zeros_like(h)
            outputs = []
            for t in range(sequence.shape[1]):
                i, f, g, o = (projected[:, t] + hidden_map(h)).chunk(4, dim=1)
                c = torch.sigmoid(f + self.forget_bias) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            sequence = torch.stack(outputs, dim=1)
        return sequence if self.every_step else sequence[:, -1]


class CharFeatures(nn.Module):
    def __init__(self, vocabulary: int):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, EMBEDDING)
        self.lstm = CellLSTM(EMBEDDING, HIDDEN, LAYERS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(self.embedding(x))


def build_char_lstm(input_shape: tuple[int, ...], num_classes: int) -> Classifier:
    return Classifier(CharFeatures(num_classes), HIDDEN, num_classes)

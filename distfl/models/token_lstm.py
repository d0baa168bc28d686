"""The next-token LSTMs of TFF's baselines and Reddi et al. (ICLR 2021, "Adaptive Federated
Optimization", Table 6's models), predicting the token after every position (data/tokens.py):

- `shakespeare_lstm` (TFF's `char_prediction_models.create_recurrent_model`, after McMahan et al. 2017):
  embedding of the 90 tokens -> 8, two LSTM layers of 256 -> [features, d = 256] -> head Linear(256 -> 90).
  820,522 parameters for TFF's 86 characters + pad, out-of-vocabulary, bos, eos.
- `stackoverflow_lstm` (TFF's `word_prediction_models.create_recurrent_model` with its defaults): embedding
  of the 10,004 tokens -> 96, one LSTM layer of 670, Dense(670 -> 96) -> [features, d = 96] -> head
  Linear(96 -> 10,004). 4,050,748 parameters, the count the paper gives.

The LSTM is models/char_lstm.py's CellLSTM at every step (so client packs can vectorise it), as Keras's
LSTM computes it: gates i, f, g, o, one bias per layer, nothing added to the forget gate. Initialisation
as Keras draws it (its distributions, not its random stream): embeddings U(-0.05, 0.05), LSTM input kernels
Glorot-uniform (Shakespeare's: He-normal, truncated at 2 standard deviations), recurrent kernels
orthogonal, the bias 0 except the forget gate's 1 (`unit_forget_bias`), dense layers Glorot-uniform with
zero bias. Keras's `mask_zero` is not needed: padding only ever follows a sequence's tokens, so it never
changes an output at a real position, and the loss leaves padding targets out.
Inputs: int64 tokens, B x L; logits B x L x V.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from distfl.models.base import TokenClassifier
from distfl.models.char_lstm import CellLSTM

_TRUNCATED_STD = 0.87962566103423978  # Keras: the std of a unit normal truncated at +-2, which He-normal divides by


def _keras_lstm_init(lstm: CellLSTM, he_normal: bool) -> None:
    for input_map, hidden_map in zip(lstm.input_maps, lstm.hidden_maps):
        if he_normal:
            std = math.sqrt(2.0 / input_map.in_features) / _TRUNCATED_STD
            nn.init.trunc_normal_(input_map.weight, std=std, a=-2 * std, b=2 * std)
        else:
            nn.init.xavier_uniform_(input_map.weight)
        nn.init.orthogonal_(hidden_map.weight)
        with torch.no_grad():
            input_map.bias.zero_()
            input_map.bias[lstm.hidden:2 * lstm.hidden] = 1.0  # the forget gate (order i, f, g, o)


def _dense(inputs: int, outputs: int) -> nn.Linear:
    layer = nn.Linear(inputs, outputs)
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


class TokenLSTM(nn.Module):
    """embedding -> stacked LSTM (every step) -> optional Dense projection: B x L -> B x L x d."""

    def __init__(self, vocabulary: int, embedding: int, hidden: int, layers: int, projection: int = 0,
                 he_normal: bool = False):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, embedding)
        nn.init.uniform_(self.embedding.weight, -0.05, 0.05)
        self.lstm = CellLSTM(embedding, hidden, layers, every_step=True, forget_bias=0.0)
        _keras_lstm_init(self.lstm, he_normal)
        self.projection = _dense(hidden, projection) if projection else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lstm(self.embedding(x))
        return h if self.projection is None else self.projection(h)


def _token_classifier(features: nn.Module, feature_dim: int, vocabulary: int) -> TokenClassifier:
    model = TokenClassifier(features, feature_dim, vocabulary)
    model.head = _dense(feature_dim, vocabulary)
    return model


def build_shakespeare_lstm(input_shape: tuple[int, ...], num_classes: int) -> TokenClassifier:
    return _token_classifier(TokenLSTM(num_classes, 8, 256, 2, he_normal=True), 256, num_classes)


def build_stackoverflow_lstm(input_shape: tuple[int, ...], num_classes: int) -> TokenClassifier:
    return _token_classifier(TokenLSTM(num_classes, 96, 670, 1, projection=96), 96, num_classes)

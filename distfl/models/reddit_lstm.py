"""LEAF's Reddit next-word LSTM (Caldas et al. 2018; TalwalkarLab/leaf models/reddit/stacked_lstm.py with
baseline_constants.py's seq_len 10, n_hidden 256, num_layers 2), a prediction at every position
(data/tokens.py):

    embedding of the vocabulary's `size` ids (10,000) -> 256, 2 LSTM layers of 256 (TensorFlow's
    LSTMBlockCell with forget_bias 0) -> [features, d = 256] -> head Linear(256 -> size)

Initialisation as its variable scope draws it: every weight U(-0.1, 0.1) (init_scale 0.1), the LSTM biases 0.
10,000 ids: 6,180,624 parameters. What LEAF's training does beyond the model is not carried over: it passes
an LSTM state from one batch to the next (each chunk here starts from zero, so a chunk's prediction does
not depend on which chunks share its batch), clips gradients to norm 5, and keeps dropout off (keep_prob 1).
"""
from __future__ import annotations

from torch import nn

from distfl.models.base import TokenClassifier
from distfl.models.char_lstm import CellLSTM

HIDDEN = 256
LAYERS = 2
INIT_SCALE = 0.1


class RedditFeatures(nn.Module):
    def __init__(self, vocabulary: int):
        super().__init__()
        self.embedding = nn.Embedding(vocabulary, HIDDEN)
        self.lstm = CellLSTM(HIDDEN, HIDDEN, LAYERS, every_step=True, forget_bias=0.0)

    def forward(self, x):
        return self.lstm(self.embedding(x))


def build_reddit_lstm(input_shape: tuple[int, ...], num_classes: int) -> TokenClassifier:
    model = TokenClassifier(RedditFeatures(num_classes), HIDDEN, num_classes)
    for name, tensor in model.named_parameters():
        if name.startswith("features.lstm.") and name.endswith(".bias"):
            nn.init.zeros_(tensor)
        else:
            nn.init.uniform_(tensor, -INIT_SCALE, INIT_SCALE)
    return model

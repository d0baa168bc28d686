"""LEAF's Sent140 LSTM (Caldas et al. 2018; TalwalkarLab/leaf models/sent140/stacked_lstm.py with
baseline_constants.py's seq_len 25, n_hidden 100): is a tweet positive?

    embedding of LEAF's word ids (data/leaf_text.py) -> 2 stacked LSTM layers of 100 -> the last step's
    output (the 25th position: LEAF pads short tweets with the unknown id and reads position 25 whatever
    the tweet's length) -> Dense(100 -> 128), no activation, as LEAF's fc1 [= features, d = 128]
    -> head Linear(128 -> 2)

model.embedding picks the embedding:
- frozen (default): the vectors of data.embeddings (get_embs.py's embs.json from GloVe: len(vocab) + 1 rows,
  the last the zero vector of the unknown id), never trained, as FedProx's Sent140 model holds them
  (`trainable=False`). They are data, not state: a non-persistent buffer of a `frozen` module, so they stay
  out of the flat parameters, the aggregation and the checkpoints (data.embeddings is hashed instead).
- trained: the same vectors as the start of a trained, aggregated table.
- learned: what LEAF's stacked_lstm.py builds as it runs: a (len(vocab) + 1) x 100 table drawn at random
  (Glorot-uniform, TensorFlow's get_variable default) and trained; the file gives only the vocabulary.
The LSTM is models/char_lstm.py's CellLSTM (TensorFlow's BasicLSTMCell: forget bias 1), so packs vectorise
it. Initialisation otherwise PyTorch's. Inputs: int64 word ids, B x 25.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from distfl.errors import ConfigError
from distfl.models.base import Classifier
from distfl.models.char_lstm import CellLSTM

HIDDEN = 100  # baseline_constants.py: 'sent140.stacked_lstm': (lr, seq_len 25, num_classes 2, num_hidden 100)
LAYERS = 2
DENSE = 128  # stacked_lstm.py's fc1


class FixedEmbedding(nn.Module):
    """A lookup in a table that is data: never trained, never aggregated, never checkpointed."""

    frozen = True  # FlatModel keeps this module's buffers out of the flat vectors

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("weight", table.to(torch.float32).contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.embedding(x, self.weight)


class Sent140Features(nn.Module):
    def __init__(self, table: torch.Tensor, embedding: str):
        super().__init__()
        if embedding == "frozen":
            self.embedding = FixedEmbedding(table)
        elif embedding == "trained":
            self.embedding = nn.Embedding.from_pretrained(table.to(torch.float32).clone(), freeze=False)
        else:
            self.embedding = nn.Embedding(table.shape[0], HIDDEN)
            nn.init.xavier_uniform_(self.embedding.weight)
        self.lstm = CellLSTM(self.embedding.weight.shape[1], HIDDEN, LAYERS)
        self.dense = nn.Linear(HIDDEN, DENSE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dense(self.lstm(self.embedding(x)))


def build_sent140_lstm(input_shape: tuple[int, ...], num_classes: int, embeddings: torch.Tensor | None,
                       embedding: str) -> Classifier:
    if embeddings is None:
        raise ConfigError("model.name=sent140_lstm embeds LEAF's word ids with the vectors of data.embeddings, but "
                          "the data has none: use data.dataset=leaf with Sent140 and data.embeddings (or a folder "
                          "`distfl data prepare leaf --embeddings` wrote)")
    return Classifier(Sent140Features(embeddings, embedding), DENSE, num_classes)

"""`token_transformer`: a small causal (decoder-only) transformer for next-token tasks (data/tokens.py),
the GPT-2 block layout (Radford et al. 2019) at a size a client trains:

    token embedding (V -> 128) + learned position embedding (L -> 128)
    -> 2 blocks of [x + attention(LayerNorm(x)), then x + MLP(LayerNorm(x))]
    -> LayerNorm [= features, B x L x 128] -> head Linear(128 -> V)

attention: 4 heads of 32, each position attends to itself and the positions before it (the causal mask),
softmax(q k^T / sqrt(32)) v, the heads concatenated and mixed by a Linear; MLP: Linear(128 -> 512), GELU,
Linear(512 -> 128). No dropout (no model of the zoo has any). Written out with plain matrix products
and a boolean mask, so torch.func can vectorise it over a pack of clients. Padding only ever follows a
sequence's tokens, and a position sees no later one, so padding never changes an output at a real
position. Initialisation: GPT-2's, N(0, 0.02) for embeddings and weights, zero biases, the residual
output layers scaled by 1 / sqrt(2 x blocks). The position embedding is sized for the data's length L.
Parameters for StackOverflow's 10,004 tokens and L = 20: 2,970,388.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from distfl.models.base import TokenClassifier

WIDTH = 128
BLOCKS = 2
HEADS = 4
MLP = 4 * WIDTH


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)
        q, k, v = (t.reshape(b, length, self.heads, width // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(width // self.heads)  # B x heads x L x L
        later = torch.ones(length, length, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(later, float("-inf")).softmax(dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int):
        super().__init__()
        self.norm1, self.attention = nn.LayerNorm(width), CausalSelfAttention(width, heads)
        self.norm2, self.up, self.down = nn.LayerNorm(width), nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class CausalTransformer(nn.Module):
    """Tokens B x L -> features B x L x width."""

    def __init__(self, vocabulary: int, length: int, width: int = WIDTH, blocks: int = BLOCKS, heads: int = HEADS,
                 hidden: int = MLP):
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, width)
        self.positions = nn.Embedding(length, width)
        self.blocks = nn.ModuleList(Block(width, heads, hidden) for _ in range(blocks))
        self.norm = nn.LayerNorm(width)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
        for block in self.blocks:  # GPT-2: the layers that write into the residual stream, scaled down
            for layer in (block.attention.out, block.down):
                layer.weight.data.mul_(1 / math.sqrt(2 * blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tokens(x) + self.positions(torch.arange(x.shape[1], device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.norm(h)


def build_token_transformer(input_shape: tuple[int, ...], num_classes: int) -> TokenClassifier:
    model = TokenClassifier(CausalTransformer(num_classes, int(input_shape[0])), WIDTH, num_classes)
    nn.init.normal_(model.head.weight, std=0.02)
    nn.init.zeros_(model.head.bias)
    return model

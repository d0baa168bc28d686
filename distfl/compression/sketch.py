"""Count sketch of an update, as FetchSGD sends it (Rothchild, Panda, Ullah, Ivkin, Stoica, Braverman,
Gonzalez & Arora, "FetchSGD: communication-efficient federated learning with sketching", ICML 2020;
the sketch of Charikar, Chen & Farach-Colton 2002).

A sketch is a rows x columns table. Row j has a bucket hash h_j: [d] -> [columns] and a sign hash
s_j: [d] -> {-1, +1}; a vector x adds s_j(i) x_i into cell (j, h_j(i)). The sketch is linear, so the
server sums the clients' sketches (through the exact sum: the sum of sketches is the sketch of the sum)
and keeps momentum and error accumulation in sketch space (FetchSGD's Algorithm 1). It reads back
coordinate i as the median over rows of s_j(i) S[j, h_j(i)] and keeps the k largest estimates
(`unsketch`). The hashes are drawn once per run from the keyed generator (seed only: momentum and
error sketches of different rounds must share them). Message: rows x columns float32 values.
"""
from __future__ import annotations

import torch

from .base import FLOAT32_BITS


class CountSketch:
    def __init__(self, numel: int, rows: int, columns: int, generator: torch.Generator,
                 device: torch.device | str = "cpu"):
        if rows < 1 or columns < 1:
            raise ValueError(f"count sketch: rows and columns must be >= 1, got {rows} x {columns}")
        self.numel, self.rows, self.columns = numel, rows, columns
        # Drawn on the CPU from the keyed generator (the same hashes on every device), then moved.
        self.buckets = torch.randint(0, columns, (rows, numel), generator=generator).to(device)
        self.signs = (torch.randint(0, 2, (rows, numel), generator=generator).to(torch.float64) * 2 - 1).to(device)
        self._flat = (self.buckets + columns * torch.arange(rows, device=device).unsqueeze(1)).reshape(-1)

    def bits(self) -> int:
        return FLOAT32_BITS * self.rows * self.columns

    def sketch(self, x: torch.Tensor) -> torch.Tensor:
        """The rows x columns table of x (float64)."""
        values = (self.signs * x.reshape(1, -1).to(torch.float64)).reshape(-1)
        table = torch.zeros(self.rows * self.columns, dtype=torch.float64, device=self.signs.device)
        table.index_add_(0, self._flat, values)
        return table.view(self.rows, self.columns)

    def estimate(self, table: torch.Tensor) -> torch.Tensor:
        """Each coordinate's estimate: the median over rows of s_j(i) S[j, h_j(i)]."""
        per_row = table.reshape(-1)[self._flat].view(self.rows, self.numel) * self.signs
        return per_row.median(dim=0).values

    def unsketch(self, table: torch.Tensor, k: int) -> torch.Tensor:
        """The k coordinates with the largest estimated magnitude, the rest zero (float64)."""
        estimate = self.estimate(table)
        out = torch.zeros(self.numel, dtype=torch.float64, device=self.signs.device)
        index = torch.topk(estimate.abs(), min(k, self.numel), sorted=False).indices
        out[index] = estimate[index]
        return out

"""Staleness weights of asynchronous updates (system.staleness), s = server steps between the model a
client started from and the step that applies its update.

  constant:   1                                   (FedBuff's and FedAsync's baseline)
  polynomial: (1 + s)^-a                          (FedAsync, Xie et al. 2019, eq. "polynomial"; FedBuff
                                                   uses a = 0.5, 1 / sqrt(1 + s))
  hinge:      1 if s <= b, else 1 / (a (s - b) + 1)   (FedAsync's hinge)
"""
from __future__ import annotations


def staleness_weight(kind: str, s: int, a: float = 0.5, b: float = 4.0) -> float:
    if s < 0:
        raise ValueError(f"staleness {s} < 0")
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + s) ** -a)
    if kind == "hinge":
        return 1.0 if s <= b else 1.0 / (a * (s - b) + 1.0)
    raise ValueError(f"unknown staleness function {kind!r}")

"""Learning rate of a round: `train.lr` for local SGD, `server.lr` for the server optimizer.

Both sections carry the same keys (`lr`, `lr_schedule`, `lr_warmup_rounds`, `lr_min`, `lr_step_every`,
`lr_gamma`). With round t = 1..T (T = train.rounds), W warm-up rounds and u = t - W - 1 rounds since the
warm-up ended (U = T - W of them):

    t <= W:    lr * (t / W)                                     (linear warm-up, lr itself at round W)
    constant:  lr
    cosine:    lr_min + (lr - lr_min) * (1 + cos(pi * u / U)) / 2      (lr at u = 0, lr_min at u = U)
    step:      lr * lr_gamma ** (u // lr_step_every)

The lr is a pure function of (config, round): a resumed run uses the same lr as an uninterrupted one and
nothing about it is checkpointed.
"""
from __future__ import annotations

import math


def round_lr(section, round_idx: int, total_rounds: int) -> float:
    """The lr of 1-based round `round_idx` of `total_rounds` under `section`'s schedule."""
    lr, warmup = float(section.lr), int(section.lr_warmup_rounds)
    if round_idx <= warmup:
        return lr * (round_idx / warmup)
    u, span = round_idx - warmup - 1, total_rounds - warmup
    if section.lr_schedule == "cosine":
        return section.lr_min + (lr - section.lr_min) * (1 + math.cos(math.pi * u / span)) / 2
    if section.lr_schedule == "step":
        return lr * section.lr_gamma ** (u // section.lr_step_every)
    return lr

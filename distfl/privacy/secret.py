"""Where a private run's randomness comes from: a secret key, or the config's seed (privacy.secure_noise).

The Gaussian noise protects the released models only if whoever reads them cannot regenerate it: noise
drawn from (seed, round), with the seed in config.yaml, can be subtracted from a released update, leaving
the exact clipped sum. Privacy amplification by sampling likewise assumes the cohorts are unknown.

secret (privacy.secure_noise=true, the default): rank 0 draws a 128-bit key from the operating system's
secure source (`secrets`, i.e. os.urandom) and sends it to the other ranks in one all_reduce of four int64
words (the other ranks add zeros), so every rank draws the same noise and cohorts from it and the run is
still bit-identical on 1 or N ranks. The draws come from AES-128-CTR keyed by the whole key (csprng.py), a
cryptographically secure generator. The key is written only into each checkpoint, as NOISE_KEY_FILE with
owner-only permissions (0600), so a resumed run continues with the same noise; never into the config,
metrics, logs or summary.json. Deleting the checkpoints deletes the key.

keyed (privacy.secure_noise=false): everything from the config's seed, as in non-private runs (torch's and
numpy's generators): a simulation, reproducible from the config, whose noise anyone with the config can
regenerate.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

import numpy as np
import torch

from .. import dist
from ..errors import CheckpointError
from . import csprng

NOISE_KEY_FILE = "noise_key"
_WORDS = 4  # 32-bit words of the 128-bit key (each fits an int64 sum exactly)
SIMULATION = "simulation: noise reproducible from the config"


class NoiseKey:
    """The entropy the run's noise and cohorts are drawn from. `value` is the secret key (secret mode)
    or the config's seed (keyed mode). repr/str never show a secret key."""

    def __init__(self, secret: bool, value: int):
        self.secret, self.value = secret, int(value)

    @property
    def mode(self) -> str:
        return "secret" if self.secret else "keyed"

    def __repr__(self) -> str:
        return f"NoiseKey({self.mode})" if self.secret else f"NoiseKey(keyed, seed={self.value})"

    __str__ = __repr__

    def normal(self, keyed: list[int], stream: tuple[int, int, int], numel: int, device) -> torch.Tensor:
        """`numel` standard normal float64 draws on `device`, the same on every rank and after a resume:
        secret, from the CSPRNG's stream `stream` = (domain, index, round) (csprng.py); keyed, from the seed
        and the words `keyed` (keyed_normal)."""
        if self.secret:
            return csprng.normal(self.value, *stream, numel, device)
        return keyed_normal([self.value, *keyed], numel, device)


def keyed_normal(entropy: list[int], numel: int, device) -> torch.Tensor:
    """Standard normal float64 draws from a generator on `device` seeded by a digest of `entropy` (the
    key or seed first): the same on every rank, and after a resume."""
    seed = int(np.random.SeedSequence(entropy).generate_state(2, np.uint32).astype(np.uint64)
               @ np.array([1, 2**31], dtype=np.uint64))
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return torch.randn(numel, generator=generator, dtype=torch.float64, device=device)


def draw(ctx) -> int:
    """A fresh 128-bit key from the OS's secure source on rank 0, the same on every rank (ctx None: one
    process, no process group)."""
    if ctx is None:
        return secrets.randbits(32 * _WORDS)
    words = [secrets.randbits(32) for _ in range(_WORDS)] if ctx.is_main else [0] * _WORDS
    summed = dist.all_reduce_sum(torch.tensor(words, dtype=torch.int64, device=ctx.device), ctx, "privacy_key")
    return sum(int(w) << (32 * i) for i, w in enumerate(summed.tolist()))


def write(key: NoiseKey, checkpoint_dir: Path) -> None:
    """Rank 0, into a checkpoint being written: the secret key, readable by its owner only."""
    if not key.secret:
        return
    path = Path(checkpoint_dir) / NOISE_KEY_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # also when the file existed, and whatever the umask
        os.write(fd, f"{key.value:032x}\n".encode())
    finally:
        os.close(fd)


def restored(secure: bool, saved_mode: str | None, checkpoint_dir: Path) -> NoiseKey | None:
    """The key a resumed run continues with (None: keyed, from the seed). A checkpoint without a mode
    predates privacy.secure_noise and drew keyed noise."""
    saved_mode = saved_mode or "keyed"
    if saved_mode != ("secret" if secure else "keyed"):
        raise CheckpointError(
            f"cannot resume from {checkpoint_dir}: its noise was {saved_mode}, the config asks for "
            f"privacy.secure_noise={str(secure).lower()}; a run keeps its noise mode (set "
            f"privacy.secure_noise={str(saved_mode == 'secret').lower()})")
    return NoiseKey(True, read(checkpoint_dir)) if secure else None


def read(checkpoint_dir: Path) -> int:
    path = Path(checkpoint_dir) / NOISE_KEY_FILE
    try:
        return int(path.read_text().strip(), 16)
    except (OSError, ValueError):
        raise CheckpointError(
            f"cannot resume from {checkpoint_dir}: its secret noise key {path.name} is missing or unreadable, so "
            "the run cannot continue with its own noise (privacy.secure_noise=true); start the run again") from None

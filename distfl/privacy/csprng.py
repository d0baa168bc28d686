"""Secret mode's randomness: AES-128 in counter mode (AES-CTR), keyed by the run's whole 128-bit key.

A private run's noise and cohorts in secret mode (privacy.secure_noise=true, secret.py) come from the
keystream of AES-128-CTR (the `cryptography` library, OpenSSL underneath) under the run's key: a
cryptographically secure generator, so the released models, whose updates are mostly noise, tell a reader
nothing that helps predict the rest of the stream or recover the key. (torch's and numpy's generators
are not: a Mersenne Twister's state is linear in its outputs.)

Streams. The 16-byte counter block of AES-CTR is split into a stream identity (the high 8 bytes) and a
block counter (the low 8 bytes, from 0):

    domain (1 byte) | index (1 byte) | round (6 bytes) | block counter (8 bytes)

domain: what the draw is for (the noise of a round, a tree node, a banded round, a cohort); index: which
draw of that round (update or count noise; a tree node's level; the cohort rule); round: 1-based. Distinct
(domain, index, round) never share a counter block, since a stream would need 2^64 blocks (256 EiB) to
reach the next; so every draw is independent of every other, and a pure function of (key, domain, index,
round): the same on every rank and after a resume, with no generator state to carry.

Uniforms: the keystream read as little-endian uint64 words w; a word's top 53 bits k = w >> 11 give the
float64 k 2^-53 in [0, 1), every multiple of 2^-53 equally likely.

Gaussians (Box and Muller, 1958), in float64 from a pair of words (k1, k2) per pair of outputs:
    u1 = (k1 + 1) 2^-53 in (0, 1],  u2 = k2 2^-53 in [0, 1),
    z1 = sqrt(-2 ln u1) cos(2 pi u2),  z2 = sqrt(-2 ln u1) sin(2 pi u2),
two independent standard normals for exactly uniform u1, u2. With 53-bit uniforms, |z| <= sqrt(106 ln 2)
= 8.57: the tails beyond (probability 1e-17) are cut. Output i is z1 of pair i // 2 when i is even, z2
when odd; n draws use ceil(n / 2) pairs (16 bytes of keystream per pair).

Cohorts: Poisson includes client c iff its uniform is < q (probability q to within 2^-53); random (a fixed
number of clients without replacement) takes the `size` clients with the smallest 64-bit words (ties to
the lower id), which is a uniform sample of that size except on a tie (probability below N^2 2^-65).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_KEY_BITS = 128
_ROUND_LIMIT = 1 << 48
_CHUNK = 1 << 22  # keystream bytes produced per call into OpenSSL: bounds the temporary zeros
_TWO_53 = 2.0 ** -53


def counter_block(domain: int, index: int, round_idx: int) -> int:
    """The first counter block of stream (domain, index, round)."""
    if not (0 <= domain < 256 and 0 <= index < 256 and 0 <= round_idx < _ROUND_LIMIT):
        raise ValueError(f"secret noise stream (domain={domain}, index={index}, round={round_idx}) is out of range: "
                         f"domain and index must be in [0, 256), round in [0, 2^48)")
    return domain << 120 | index << 112 | round_idx << 64


def keystream(key: int, block: int, nbytes: int) -> np.ndarray:
    """`nbytes` of the AES-128-CTR keystream under `key` (big-endian bytes, as the key file's hex), the
    counter starting at `block`: uint8."""
    if not 0 <= key < 1 << _KEY_BITS:
        raise ValueError(f"the secret noise key must be a {_KEY_BITS}-bit integer")
    encryptor = Cipher(algorithms.AES(key.to_bytes(16, "big")), modes.CTR(block.to_bytes(16, "big"))).encryptor()
    out = np.empty(nbytes, dtype=np.uint8)
    zeros = bytes(min(_CHUNK, nbytes))
    for start in range(0, nbytes, _CHUNK):
        size = min(_CHUNK, nbytes - start)
        out[start : start + size] = np.frombuffer(encryptor.update(zeros[:size]), dtype=np.uint8)
    return out


def words(key: int, domain: int, index: int, round_idx: int, count: int) -> np.ndarray:
    """The first `count` uint64 words (little-endian) of stream (domain, index, round)."""
    return keystream(key, counter_block(domain, index, round_idx), 8 * count).view("<u8")


def uniform53(w: np.ndarray) -> np.ndarray:
    """k 2^-53 in [0, 1), k the top 53 bits of each word: float64 (exact)."""
    return (w >> np.uint64(11)).astype(np.float64) * _TWO_53


def normal(key: int, domain: int, index: int, round_idx: int, numel: int, device) -> torch.Tensor:
    """`numel` standard normal float64 draws of stream (domain, index, round) on `device` (Box-Muller, see
    the module's docstring)."""
    pairs = -(-numel // 2)
    w = words(key, domain, index, round_idx, 2 * pairs).reshape(pairs, 2)
    u = torch.from_numpy((w >> np.uint64(11)).astype(np.float64)).to(device)
    radius = torch.sqrt(-2.0 * torch.log((u[:, 0] + 1.0) * _TWO_53))
    angle = (2.0 * math.pi) * (u[:, 1] * _TWO_53)
    return torch.stack((radius * torch.cos(angle), radius * torch.sin(angle)), dim=1).reshape(-1)[:numel]


def cohort(key: int, domain: int, round_idx: int, num_clients: int, size: int, rule: str) -> list[int]:
    """Round `round_idx`'s clients (sorted ids) under cohort `rule` (poisson or random, as
    Population.cohort), from stream (domain, 0, round)."""
    if rule == "poisson":
        inside = uniform53(words(key, domain, 0, round_idx, num_clients)) < size / num_clients
        return [int(c) for c in np.flatnonzero(inside)]
    if rule != "random":
        raise ValueError(f"secret cohorts are poisson or random, not {rule!r}")
    if size >= num_clients:
        return list(range(num_clients))
    order = np.argsort(words(key, domain, 0, round_idx, num_clients), kind="stable")
    return sorted(int(c) for c in order[:size])

"""Compressors of a client's update: what a client sends instead of its float32 update.

Each compressor is one file beside its paper. It takes a float32 vector (one segment of a client's
update, or the whole update) and a generator keyed by (seed, round, client, segment) and returns a
`Compressed`: the decoded vector the server adds into its sum (the server decodes, then the exact
fixed-point sum adds it like any other update) and the exact size in bits of the message the client
would send, from the closed form documented beside the compressor.

PowerSGD (powersgd.py) compresses weight-shaped segments with a state of its own (the warm-start Q), and
FetchSGD's count sketch (sketch.py) is summed as a sketch by the server, so both have their own
interfaces beside `Compressor`.

The decoded vector is what the simulation needs: a compressor changes what is summed and what travels,
never how the sum is taken, so a compressed run keeps the exact sum's guarantees (bit-identical on 1 or
N ranks, in packs and across a stop and resume), because every random choice comes from the keyed
generator, never from the rank's generator.
"""
from __future__ import annotations

from .base import Compressed, Compressor, keyed_generator
from .drive import Drive
from .eden import Eden
from .error_feedback import ErrorFeedback
from .floats import HalfPrecision
from .powersgd import PowerSGD
from .qsgd import QSGD
from .signsgd import ScaledSign
from .sketch import CountSketch
from .sparse import RandK, TopK

COMPRESSORS = {
    "topk": TopK,
    "randk": RandK,
    "qsgd": QSGD,
    "signsgd": ScaledSign,
    "drive": Drive,
    "eden": Eden,
    "fp16": lambda **options: HalfPrecision(dtype="fp16", **options),
    "bf16": lambda **options: HalfPrecision(dtype="bf16", **options),
}


def build(name: str, **options) -> Compressor:
    """The compressor `name` (a key of COMPRESSORS) with its options; one line naming the valid names
    otherwise."""
    try:
        factory = COMPRESSORS[name]
    except KeyError:
        raise ValueError(f"unknown compressor {name!r}; valid: {', '.join(sorted(COMPRESSORS))}") from None
    return factory(**options)


__all__ = ["COMPRESSORS", "Compressed", "Compressor", "CountSketch", "Drive", "Eden", "ErrorFeedback", "HalfPrecision", "PowerSGD", "QSGD",
           "RandK", "ScaledSign", "TopK", "build", "keyed_generator"]

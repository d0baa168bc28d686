"""Per-round statistics: every client's contributions summed into one buffer, one all_reduce.

Why fixed point. A float sum depends on the order of its terms, so a model averaged over clients
0..9 on one rank differs in the last bits from the same average over {0,2,4,6,8} + {1,3,5,7,9} on two.
distfl therefore converts each client's contribution (computed in float64) to a 64-bit integer in units
of 2^-frac_bits, and sums integers, which is exact and associative. The result is bit-identical for
any number of ranks and any placement of clients on ranks. The price: the all_reduce moves int64
(8 bytes a value, like float64), and values are rounded to 2^-40 ~ 9.1e-13 absolute (far below the
float32 resolution of any parameter it is added to).

Segments are declared by name and size. `fixed` segments hold real numbers; `int` segments hold
integer counts (exact at any size). A value whose magnitude could overflow the int64 sum is refused and
counted as non-finite, which stops the run like a NaN would.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import dist

FRAC_BITS = 40


@dataclass(frozen=True)
class Segment:
    name: str
    numel: int
    kind: str = "fixed"  # fixed | int
    frac_bits: int = FRAC_BITS


# Every round carries these beside the algorithm's own segments.
STANDARD_SEGMENTS = (
    Segment("loss_sum", 1),  # sum over the round's clients of (mean local train loss * client samples)
    Segment("samples", 1, kind="int"),  # local samples processed (for loss and throughput)
    Segment("nonfinite", 1, kind="int"),  # clients whose loss or update was NaN/inf or too large
    Segment("clients", 1, kind="int"),  # clients that contributed (the cohort size, unless one failed)
    Segment("stop", 1, kind="int"),  # ranks that received a stop signal (preemption): all ranks see the sum
)


class Unrepresentable(ValueError):
    """A contribution is NaN/inf or too large to be summed exactly."""


class StatBuffer:
    """One int64 buffer holding all segments; clients add into it, `reduce` sums it over ranks."""

    def __init__(self, segments, device: torch.device, max_terms: int):
        self.segments = {s.name: s for s in segments}
        if len(self.segments) != len(segments):
            raise ValueError("duplicate segment names")
        self.offsets = {}
        offset = 0
        for s in segments:
            self.offsets[s.name] = offset
            offset += s.numel
        self.buffer = torch.zeros(offset, dtype=torch.int64, device=device)
        # Largest magnitude one term may have so that max_terms of them cannot overflow int64.
        self.max_terms = max(1, max_terms)

    def view(self, name: str) -> torch.Tensor:
        start = self.offsets[name]
        return self.buffer[start : start + self.segments[name].numel]

    def add(self, name: str, value: torch.Tensor | float | int, weight: float = 1.0) -> None:
        """Add `weight * value` (flattened) into segment `name`.

        Raises Unrepresentable (adding nothing) if a value is NaN/inf or so large that the sum of
        `max_terms` such values could overflow int64: the caller counts that as a non-finite client.
        """
        seg = self.segments[name]
        target = self.view(name)
        value = torch.as_tensor(value, device=target.device).reshape(-1)
        if value.numel() != seg.numel:
            raise ValueError(f"segment {name}: expected {seg.numel} values, got {value.numel()}")
        if seg.kind == "int":
            target.add_(value.to(torch.int64) * int(weight))
            return
        scaled = value.to(torch.float64) * (float(weight) * 2.0**seg.frac_bits)
        if scaled.numel():
            peak = float(scaled.abs().max())
            if not peak < 2.0**62 / self.max_terms:  # also catches NaN
                raise Unrepresentable(f"segment {name}: |value| up to {peak / 2.0**seg.frac_bits:.3g}")
        target.add_(torch.round(scaled).to(torch.int64))

    def reduce(self, ctx: dist.DistContext, name: str = "round_stats") -> "Reduced":
        """Sum over ranks: exactly one all_reduce, counted under `name`."""
        dist.all_reduce_sum(self.buffer, ctx, name=name)
        return Reduced(self)

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


class Reduced:
    """Read access to the summed segments: `fixed` as float64, `int` as int64."""

    def __init__(self, stats: StatBuffer):
        self._stats = stats

    def __getitem__(self, name: str) -> torch.Tensor:
        seg = self._stats.segments[name]
        raw = self._stats.view(name)
        if seg.kind == "int":
            return raw.clone()
        return raw.to(torch.float64) * 2.0 ** (-seg.frac_bits)

    def scalar(self, name: str) -> float:
        return float(self[name][0])

"""Per-round statistics: every client's contributions summed into one buffer, one all_reduce.

Why fixed point. A float sum depends on the order of its terms, so a model averaged over clients
0..9 on one rank differs in the last bits from the same average over {0,2,4,6,8} + {1,3,5,7,9} on two.
distfl therefore converts each client's contribution (computed in float64) to a 64-bit integer in units
of 2^-frac_bits, and sums integers, which is exact and associative. The result is bit-identical for
any number of ranks and any placement of clients on ranks. The price: the all_reduce moves int64
(8 bytes a value, like float64), and values are rounded to 2^-40 ~ 9.1e-13 absolute (far below the
float32 resolution of any parameter it is added to).

Segments are declared by name and size. `fixed` segments hold real numbers; `int` segments hold
integer counts (exact at any size). Each fixed segment's unit comes from a bound on what one term of it
may hold: a segment that declares `bound` (the largest |weight * value| a healthy client gives) gets the
finest unit 2^-k (k <= 40) at which `max_terms` such terms cannot overflow int64; one that declares no
bound keeps 2^-frac_bits and accepts |weight * value| below 2^(62 - frac_bits) / max_terms (2^22 / cohort
size at 2^-40: far beyond any sane weighted model update). A value outside its segment's range, or
NaN/inf, is refused (Unrepresentable, naming the segment), which stops the run like a NaN would.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import math

import torch

from .. import dist
from ..errors import PluginError

FRAC_BITS = 40
# A client's mean local loss per sample above this is a divergence, not training (a cross-entropy this
# large needs logits ~1e6 apart); it bounds `loss_sum`, whose unit follows from it.
LOSS_BOUND = 2.0**20


@dataclass(frozen=True)
class Segment:
    name: str
    numel: int
    kind: str = "fixed"  # fixed | int
    frac_bits: int = FRAC_BITS  # the unit 2^-frac_bits, unless `bound` sets it
    bound: float | None = None  # largest |weight * value| of one term; sets the unit and the valid range


# Every round carries these beside the algorithm's own segments (`round_segments` sets loss_sum's bound).
STANDARD_SEGMENTS = (
    Segment("loss_sum", 1),  # sum over the round's clients of (mean local train loss * samples processed)
    Segment("samples", 1, kind="int"),  # local samples processed (for loss and throughput)
    Segment("nonfinite", 1, kind="int"),  # clients whose loss or update was NaN/inf or too large
    Segment("clients", 1, kind="int"),  # clients that contributed (the cohort size, unless one failed)
    Segment("stop", 1, kind="int"),  # ranks that received a stop signal (preemption): all ranks see the sum
)


def round_segments(algorithm_segments, max_samples_trained: int) -> list[Segment]:
    """A round's segments. loss_sum is bounded by LOSS_BOUND per sample times the most samples a client
    of the cohort trains on in the round (its size times the local epochs, or what its fixed local
    steps cover), so its unit follows its content, not the model update's."""
    loss_bound = LOSS_BOUND * max(1, max_samples_trained)
    standard = [replace(s, bound=loss_bound) if s.name == "loss_sum" else s for s in STANDARD_SEGMENTS]
    return standard + list(algorithm_segments)


class Unrepresentable(ValueError):
    """A contribution is NaN/inf or outside its segment's range; `segment` names the segment."""

    def __init__(self, segment: str, message: str):
        super().__init__(message)
        self.segment = segment


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
        self.max_terms = max(1, max_terms)
        # Per fixed segment: its unit 2^-bits and the largest |weight * value| one term may have, such
        # that max_terms terms cannot overflow int64 (|sum| < 2^62 in units).
        self.bits, self.limits = {}, {}
        for s in segments:
            if s.kind != "fixed":
                continue
            if s.bound is None:
                self.bits[s.name] = s.frac_bits
                self.limits[s.name] = 2.0 ** (62 - s.frac_bits) / self.max_terms
            else:
                self.bits[s.name] = min(FRAC_BITS, math.floor(62 - math.log2(self.max_terms * s.bound)))
                self.limits[s.name] = float(s.bound)

    def _segment(self, name: str) -> Segment:
        try:
            return self.segments[name]
        except KeyError:
            raise PluginError(f"stats.add({name!r}): this round has no segment {name!r}; its segments are "
                              f"{', '.join(self.segments)}. Declare it in the method's segments() "
                              f"(return super().segments() + [distfl.Segment({name!r}, numel)])") from None

    def view(self, name: str) -> torch.Tensor:
        self._segment(name)
        start = self.offsets[name]
        return self.buffer[start : start + self.segments[name].numel]

    def add(self, name: str, value: torch.Tensor | float | int, weight: float = 1.0) -> None:
        """Add `weight * value` (flattened) into segment `name`.

        Raises Unrepresentable (adding nothing) if a weighted value is NaN/inf or above the segment's
        limit: the caller counts that as a client out of range.
        """
        seg = self._segment(name)
        target = self.view(name)
        value = torch.as_tensor(value, device=target.device).reshape(-1)
        if value.numel() != seg.numel:
            raise ValueError(f"segment {name}: expected {seg.numel} values, got {value.numel()}")
        if seg.kind == "int":
            target.add_(value.to(torch.int64) * int(weight))
            return
        weighted = value.to(torch.float64) * float(weight)
        if weighted.numel():
            peak = float(weighted.abs().max())
            if not peak <= self.limits[name]:  # also catches NaN
                raise Unrepresentable(name, f"segment {name}: |value| up to {peak:.3g}, limit {self.limits[name]:.3g}")
        target.add_(torch.round(weighted * 2.0 ** self.bits[name]).to(torch.int64))

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
        seg = self._stats._segment(name)
        raw = self._stats.view(name)
        if seg.kind == "int":
            return raw.clone()
        return raw.to(torch.float64) * 2.0 ** (-self._stats.bits[name])

    def scalar(self, name: str) -> float:
        return float(self[name][0])

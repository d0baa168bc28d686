"""Per-round statistics: every client's contributions summed into one buffer, one all_reduce.

Why fixed point. A float sum depends on the order of its terms, so a model averaged over clients
0..9 on one rank differs in the last bits from the same average over {0,2,4,6,8} + {1,3,5,7,9} on two.
distfl therefore converts each client's contribution (computed in float64) to a 64-bit integer in units
of 2^-frac_bits, and sums integers, which is exact and associative. The result is bit-identical for
any number of ranks and any placement of clients on ranks. The price: the all_reduce moves int64
(8 bytes a value, like float64), and values are rounded to 2^-40 ~ 9.1e-13 absolute by default (far
below the float32 resolution of any parameter it is added to).

Segments are declared by name and size. `fixed` segments hold real numbers; `int` segments hold
integer counts (exact at any size).

How a term is added, in about one pass over it. Each client's weighted value is rounded to its
segment's grid (unit 2^-bits) in float64 and added into the rank's float64 sum, which lives in the
int64 buffer's own memory; the sum becomes int64 once per round, just before the all_reduce. A float64
sum of grid values is exact while every partial sum stays below 2^53 units, and the buffer checks
that it did: it tracks, per segment, the "mass" sum over terms of |weight| * max|value|, which bounds
every partial sum of every coordinate, and refuses the round if the mass passed 2^53 units (2^13 =
8192 at the default unit 2^-40, whatever the number of clients: for weights that sum to 1, the weighted
mean's max|value|). A NaN or inf term is refused likewise. Neither check syncs with the device per
term: they are counted on the device, summed over ranks inside the round's one all_reduce, and read
once (`Reduced.problems`). Python numbers (counters, host-side scalars) are summed on the host and
join the buffer at `reduce`. A segment that declares `bound` (the largest |weight * value| one
healthy term has) gets the finest unit 2^-k (k <= 40) at which `max_terms` such terms stay exact.
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
    # float64: a rank adds its terms in float64 (about one pass a term), exact below 2^53 units.
    # int64: each term is converted on its own (slower), exact below 2^62 units: for a statistic that
    # needs the finer unit more than speed (SphereFed's one-off Z^T Z).
    accumulate: str = "float64"
    # Bytes one value of this segment takes on the way from a client to the server (bytes_up, the virtual
    # clock's upload): 4 for float32 values, what an encoding (a compressor) makes of them, or 0 for
    # bookkeeping the server learns with any reply (a loss, a count) or derives from another segment.
    wire_bytes: float = 4.0
    # The exact size of one client's encoded contribution, when a feature encodes the segment (a compressor's
    # closed form, compression/): it replaces numel x wire_bytes.
    encoded_bytes: int | None = None

    @property
    def nbytes(self) -> int:
        """What one client's contribution to this segment costs on the wire."""
        if self.encoded_bytes is not None:
            return self.encoded_bytes
        return math.ceil(self.numel * self.wire_bytes)


# Every round carries these beside the algorithm's own segments (`round_segments` sets loss_sum's bound).
# They are bookkeeping, not payload: a client's reply carries them as metadata (wire_bytes 0).
STANDARD_SEGMENTS = (
    Segment("loss_sum", 1, wire_bytes=0),  # sum over the round's clients of (mean local train loss * samples processed)
    Segment("samples", 1, kind="int", wire_bytes=0),  # local samples processed (for loss and throughput)
    Segment("nonfinite", 1, kind="int", wire_bytes=0),  # clients whose loss or update was NaN/inf or too large
    Segment("clients", 1, kind="int", wire_bytes=0),  # clients that contributed (the cohort size, unless one failed)
    Segment("stop", 1, kind="int", wire_bytes=0),  # ranks that received a stop signal (preemption): all ranks see the sum
)


def round_segments(algorithm_segments, max_samples_trained: int) -> list[Segment]:
    """A round's segments. loss_sum is bounded by LOSS_BOUND per sample times the most samples a client
    of the cohort trains on in the round (its size times the local epochs, or what its fixed local
    steps cover), so its unit follows its content, not the model update's."""
    loss_bound = LOSS_BOUND * max(1, max_samples_trained)
    standard = [replace(s, bound=loss_bound) if s.name == "loss_sum" else s for s in STANDARD_SEGMENTS]
    return standard + list(algorithm_segments)


# Per rank, the float64 sum of grid values stays exact below 2^53 units; summed over W ranks as int64 it
# must stay below 2^62, so each rank's budget is min(2^53, 2^62 / W) (int64 accumulation: 2^62 / W).
# The mass that is checked against it is itself a float64 sum, off by at most a unit per 2^53: the
# margin of 2^-20 covers 2^33 terms.
MARGIN = 1 - 2.0**-20
EXACT_UNITS = 2.0**53 * MARGIN
INT64_UNITS = 2.0**62 * MARGIN


def fixed_point_bits(bound: float, max_terms: int, accumulate: str = "float64") -> int:
    """The finest unit 2^-k (k <= FRAC_BITS) at which `max_terms` terms of |value| <= bound sum exactly."""
    units = EXACT_UNITS if accumulate == "float64" else INT64_UNITS
    return min(FRAC_BITS, math.floor(math.log2(units / (max(1, max_terms) * bound))))


def buffer_values(segments) -> int:
    """How many int64 values a StatBuffer of `segments` all-reduces: theirs, and two counts per fixed
    segment (its NaN/inf terms and its ranks beyond the exact range)."""
    return sum(s.numel for s in segments) + 2 * sum(s.kind == "fixed" for s in segments)


class Aggregator:
    """How a round's sums are made: every contribution of the round (each client's statistics, the runner's
    bookkeeping: loss_sum, samples, nonfinite, clients, stop) goes through one, which sums it over the
    cohort and the ranks. The default is `StatBuffer`, the exact fixed-point sum; `aggregation.aggregator`
    names another (package.module:ClassName), built by `aggregators.round_aggregator` (docs/extending.md,
    An aggregator).

    An aggregator is built for one round as `cls(segments, device, max_terms)` (`max_terms`: the most
    terms any segment's sum holds), takes `add`/`add_rows` until `reduce`, and `reduce` returns the sums
    (`Sums`) that every rank reads alike. It makes the checks it can make of its own sums (values it
    cannot represent, sums beyond its exact range) and reports them through `Sums.problems`."""

    def begin(self, clients: list[int]) -> None:
        """The adds that follow, until the next `begin`, are these clients' (one client, or a pack's clients
        a row each in `add_rows`): for an aggregator that treats each client's terms apart (secure
        aggregation masks them). The exact sum ignores it."""

    def add(self, name: str, value, weight: float = 1.0) -> None:
        """Add `weight * value` (a tensor of the segment's size, or a Python number) into segment `name`."""
        raise NotImplementedError

    def add_rows(self, name: str, rows: torch.Tensor, weights: list[float]) -> None:
        """`add(name, rows[k], weights[k])` for every row k (a client pack's statistics)."""
        rows = rows.reshape(len(weights), -1)
        for row, weight in zip(rows, weights):
            self.add(name, row, weight)

    def reduce(self, ctx: dist.DistContext, name: str = "round_stats") -> "Sums":
        """Sum over ranks (the round's collective, counted under `name`); no `add` after it."""
        raise NotImplementedError

    def unit(self, name: str) -> float:
        """The rounding step of one term of segment `name` (0: added exactly), which a clip that must hold
        after rounding allows for (privacy.mechanism)."""
        return 0.0

    @property
    def nbytes(self) -> int:
        """The bytes the round's collective moves per rank (the metric bytes_reduced)."""
        return 0


class Sums:
    """The reduced sums as the server step reads them: `sums[name]` (float64 for fixed segments, int64 for
    int ones), the same on every rank. `failure`: why the aggregator could not sum this round (secure
    aggregation with too few survivors; the round is then skipped), else None. `metrics`: the
    aggregator's own numbers for the round's row."""

    failure: str | None = None

    @property
    def metrics(self) -> dict:
        return {}

    def __getitem__(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    def scalar(self, name: str) -> float:
        return float(self[name][0])

    def problems(self) -> dict[str, str]:
        """{segment: what is wrong} for sums that are not what the terms added up to; {} when all are."""
        return {}


def wire_bytes(segments) -> int:
    """What a transfer of `segments` costs: the sum of their wire bytes (Segment.wire_bytes)."""
    return sum(s.nbytes for s in segments)


class StatBuffer(Aggregator):
    """One int64 buffer holding all segments; clients add into it, `reduce` sums it over ranks."""

    def __init__(self, segments, device: torch.device, max_terms: int):
        self.segments = {s.name: s for s in segments}
        if len(self.segments) != len(segments):
            raise ValueError("duplicate segment names")
        self.fixed = [s.name for s in segments if s.kind == "fixed"]
        # Internal counts, summed over ranks with the rest: per fixed segment, its NaN/inf terms and the
        # ranks whose sum left float64's exact range.
        internal = [Segment("_nonfinite", len(self.fixed), kind="int"), Segment("_inexact", len(self.fixed), kind="int")]
        self.offsets = {}
        offset = 0
        for s in [*segments, *internal]:
            self.offsets[s.name] = offset
            offset += s.numel
        self.internal = {s.name: s for s in internal}
        self.buffer = torch.zeros(offset, dtype=torch.int64, device=device)
        self.sums = self.buffer.view(torch.float64)  # the fixed segments' float64 sums, until `reduce`
        self.max_terms = max(1, max_terms)
        self.bits = {}
        for s in segments:
            if s.kind == "fixed":
                self.bits[s.name] = (s.frac_bits if s.bound is None
                                     else fixed_point_bits(s.bound, self.max_terms, s.accumulate))
        largest = max((self.segments[n].numel for n in self.fixed), default=0)
        self._scratch = torch.empty(largest, dtype=torch.float64, device=device)
        whole = max((self.segments[n].numel for n in self.fixed if self.segments[n].accumulate == "int64"), default=0)
        self._scratch_int = torch.empty(whole, dtype=torch.int64, device=device)
        self._mass = torch.zeros(len(self.fixed), dtype=torch.float64, device=device)  # in units
        self._host_mass = [0.0] * len(self.fixed)
        self._host: dict[str, list[int]] = {}  # Python-number terms, summed exactly on the host
        self._host_nonfinite = [0] * len(self.fixed)
        self._reduced = False

    def _segment(self, name: str) -> Segment:
        try:
            return self.segments[name]
        except KeyError:
            raise PluginError(f"stats.add({name!r}): this round has no segment {name!r}; its segments are "
                              f"{', '.join(self.segments)}. Declare it in the method's segments() "
                              f"(return super().segments() + [distfl.Segment({name!r}, numel)])") from None

    def view(self, name: str) -> torch.Tensor:
        seg = self.internal.get(name) or self._segment(name)
        start = self.offsets[name]
        return self.buffer[start : start + seg.numel]

    def _sum_view(self, name: str) -> torch.Tensor:
        start = self.offsets[name]
        return self.sums[start : start + self.segments[name].numel]

    def add(self, name: str, value: torch.Tensor | float | int, weight: float = 1.0) -> None:
        """Add `weight * value` (flattened) into segment `name`. Never syncs with the device: a NaN/inf
        term or a sum beyond the exact range is found at `reduce` (`Reduced.problems`)."""
        if self._reduced:
            raise RuntimeError("StatBuffer.add after reduce")
        seg = self._segment(name)
        if not isinstance(value, torch.Tensor):
            self._add_number(seg, value, weight)
            return
        value = value.reshape(-1)
        if value.numel() != seg.numel:
            raise ValueError(f"segment {name}: expected {seg.numel} values, got {value.numel()}")
        if value.device != self.buffer.device:
            value = value.to(self.buffer.device)
        if seg.kind == "int":
            self.view(name).add_(value.to(torch.int64) * int(weight))
            return
        if not seg.numel:
            return
        i = self.fixed.index(name)
        low, high = torch.aminmax(value)
        peak = torch.maximum(high, -low).to(torch.float64)  # NaN if any value is NaN
        self.view("_nonfinite")[i].add_(~torch.isfinite(peak))
        self._mass[i].add_(peak * (abs(float(weight)) * 2.0 ** self.bits[name]))
        scratch = self._scratch[: seg.numel]
        scratch.copy_(value)
        # (value * weight) * 2^bits == value * (weight * 2^bits) exactly: scaling by 2^bits is exact.
        scratch.mul_(float(weight) * 2.0 ** self.bits[name]).round_()
        if seg.accumulate == "int64":
            as_int = self._scratch_int[: seg.numel]
            as_int.copy_(scratch)
            self.view(name).add_(as_int)
        else:
            self._sum_view(name).add_(scratch)

    def add_rows(self, name: str, rows: torch.Tensor, weights: list[float]) -> None:
        """`add(name, rows[k], weights[k])` for every row k, in a few vectorised passes (a client pack's
        statistics): the same sums, bit for bit, since each row's fixed-point terms are the ones `add`
        computes and integer sums do not depend on their order."""
        if self._reduced:
            raise RuntimeError("StatBuffer.add_rows after reduce")
        seg = self._segment(name)
        rows = rows.reshape(len(weights), -1)
        if rows.shape[1] != seg.numel:
            raise ValueError(f"segment {name}: expected rows of {seg.numel} values, got {rows.shape[1]}")
        if rows.device != self.buffer.device:
            rows = rows.to(self.buffer.device)
        if seg.kind == "int":
            factors = torch.tensor([int(w) for w in weights], dtype=torch.int64, device=rows.device)
            self.view(name).add_((rows.to(torch.int64) * factors[:, None]).sum(0))
            return
        if not seg.numel:
            return
        i = self.fixed.index(name)
        low, high = torch.aminmax(rows, dim=1)
        peak = torch.maximum(high, -low).to(torch.float64)
        self.view("_nonfinite")[i].add_((~torch.isfinite(peak)).sum())
        scale = [float(w) * 2.0 ** self.bits[name] for w in weights]
        masses = torch.tensor([abs(float(w)) * 2.0 ** self.bits[name] for w in weights], dtype=torch.float64,
                              device=rows.device)
        self._mass[i].add_((peak * masses).sum())
        factors = torch.tensor(scale, dtype=torch.float64, device=rows.device)[:, None]
        # In chunks of rows, so the float64 copy stays within the scratch of a few clients.
        chunk = max(1, self._scratch.numel() * 4 // max(seg.numel, 1))
        for start in range(0, len(weights), chunk):
            terms = (rows[start:start + chunk].to(torch.float64) * factors[start:start + chunk]).round_()
            if seg.accumulate == "int64":
                self.view(name).add_(terms.to(torch.int64).sum(0))
            else:
                self._sum_view(name).add_(terms.sum(0))

    def _add_number(self, seg: Segment, value, weight: float) -> None:
        if seg.numel != 1:
            raise ValueError(f"segment {seg.name}: expected {seg.numel} values, got a number")
        terms = self._host.setdefault(seg.name, [0])
        if seg.kind == "int":
            terms[0] += int(value) * int(weight)
            return
        i = self.fixed.index(seg.name)
        scaled = float(value) * float(weight) * 2.0 ** self.bits[seg.name]
        if not math.isfinite(scaled):
            self._host_nonfinite[i] += 1
            return
        self._host_mass[i] += abs(scaled)
        terms[0] += round(scaled)

    def reduce(self, ctx: dist.DistContext, name: str = "round_stats") -> "Reduced":
        """Sum over ranks: exactly one all_reduce, counted under `name`."""
        world = max(1, ctx.world_size)
        budgets = [min(EXACT_UNITS if self.segments[n].accumulate == "float64" else INT64_UNITS, INT64_UNITS / world)
                   for n in self.fixed]
        if self.fixed:
            mass = self._mass + torch.tensor(self._host_mass, dtype=torch.float64, device=self._mass.device)
            budget = torch.tensor(budgets, dtype=torch.float64, device=self._mass.device)
            self.view("_inexact").add_(~(mass <= budget))
            self.view("_nonfinite").add_(torch.tensor(self._host_nonfinite, device=self.buffer.device))
        for seg_name in self.fixed:
            # NaN/inf make arbitrary integers here; the counts above say so and the caller stops.
            if self.segments[seg_name].accumulate == "float64":
                self.view(seg_name).copy_(self._sum_view(seg_name))
        for seg_name, terms in self._host.items():
            # Past int64 a fixed sum is flagged by its mass above; an int one wraps as torch's int64 would.
            terms = [(t + 2**63) % 2**64 - 2**63 for t in terms]
            self.view(seg_name).add_(torch.tensor(terms, dtype=torch.int64, device=self.buffer.device))
        self._reduced = True
        dist.all_reduce_sum(self.buffer, ctx, name=name)
        return Reduced(self)

    def unit(self, name: str) -> float:
        return 2.0 ** -self.bits[name] if name in self.bits else 0.0

    def limit(self, name: str) -> float:
        """The largest sum over a rank's terms of |weight| * max|value| segment `name` takes (one rank)."""
        units = EXACT_UNITS if self.segments[name].accumulate == "float64" else INT64_UNITS
        return units * 2.0 ** -self.bits[name]

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


class Reduced(Sums):
    """Read access to the summed segments: `fixed` as float64, `int` as int64."""

    def __init__(self, stats: StatBuffer):
        self._stats = stats

    def __getitem__(self, name: str) -> torch.Tensor:
        seg = self._stats._segment(name)
        raw = self._stats.view(name)
        if seg.kind == "int":
            return raw.clone()
        return raw.to(torch.float64) * 2.0 ** (-self._stats.bits[name])

    def problems(self) -> dict[str, str]:
        """Fixed segments whose sum is not exact, summed over ranks: {name: what was wrong}. Empty for a
        healthy round. One read from the device."""
        stats = self._stats
        if not stats.fixed:
            return {}
        counts = torch.cat([stats.view("_nonfinite"), stats.view("_inexact")]).tolist()
        n = len(stats.fixed)
        found = {}
        for i, name in enumerate(stats.fixed):
            parts = []
            if counts[i]:
                parts.append(f"NaN/inf in {counts[i]} term(s)")
            if counts[n + i]:
                parts.append(f"sum of |weight| * max|value| above {stats.limit(name):.3g} on {counts[n + i]} rank(s)")
            if parts:
                found[name] = "; ".join(parts)
        return found

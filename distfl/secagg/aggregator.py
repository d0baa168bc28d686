"""Secure aggregation as a round's aggregator (`secagg.bits` > 0; docs/secagg.md).

The model's update segments (fixed-point segments that travel, wire_bytes > 0) are summed as a secure
aggregation sums them. Each client, for each such segment:

    1. clips its term (weight x value) to [-clip, clip] coordinate-wise,
    2. scales it by 2^scale_bits and rounds it stochastically to integers (unbiased; keyed by seed, round,
       client, segment and the add's number, so any rank draws the same),
    3. wraps it modulo 2^bits and adds its masks (masks.py: pairwise masks with its neighbours and a
       self-mask, keyed by the run's seed and the round).

The rank's masked terms are summed modulo 2^bits, the ranks' sums by one exact int64 all_reduce and then
modulo 2^bits, so the sum is the same on any number of ranks and in any order. The server removes the
self-masks of the clients that reported and the pairwise masks of the clients that were sampled but did
not report (the clock's dropouts and deadlines), takes the signed residue in [-2^(bits-1), 2^(bits-1))
and divides by 2^scale_bits.

The simulator also sums the clients' integers without masks or wrapping (which a real server never sees):
the coordinates of that sum outside the modular range are the round's wraps (`secagg_wraps`), and with
`secagg.verify` the unmasked modular sum is checked against it. Bookkeeping segments (loss_sum, samples,
clients, nonfinite, stop, and any segment with wire_bytes 0) are metadata outside the secure sum and are
summed exactly, as without secure aggregation."""
from __future__ import annotations

import functools
import hashlib
import math
import struct

import torch

from .. import dist
from ..errors import ConfigError, DistflError, PluginError
from ..federation.aggregate import Aggregator, Segment, StatBuffer, Sums
from ..compression.rotation import Rotation, padded_size
from ..privacy.distributed import DistributedDP
from . import cost
from .masks import MaskedRound
from .rounding import conditional_round


class SecAggFailure(DistflError):
    """A round with fewer survivors than secagg.threshold, under secagg.on_failure=stop."""


def secured(segment: Segment) -> bool:
    """Whether a segment goes through the secure sum: a real-valued segment that travels."""
    return segment.kind == "fixed" and segment.wire_bytes > 0 and segment.numel > 0


def check_config(v: dict) -> None:
    """One line for a secure-aggregation setting no run can serve (called by config validation)."""
    bits = v["secagg.bits"]
    if bits == 0:
        return
    if bits < 2:
        raise ConfigError(f"secagg.bits must be 0 (off) or in [2, 56], got {bits}")
    if v["privacy.mechanism"] not in ("none", "ddgauss", "skellam"):
        raise ConfigError(f"secagg.bits={bits} with privacy.mechanism={v['privacy.mechanism']}: central DP adds its noise "
                          "at the server, which secure aggregation hides the clients' updates from; use "
                          "privacy.mechanism=ddgauss or skellam (each client adds its own noise)")
    if v["compression.up"] != "none" and v["privacy.mechanism"] in ("ddgauss", "skellam"):
        raise ConfigError(f"privacy.mechanism={v['privacy.mechanism']} with compression.up={v['compression.up']}: the "
                          "distributed-DP pipeline is its own compressor (rotation and secagg.bits-bit rounding, as "
                          "Kairouz et al. 2021 compose them); another compressor before the secure sum changes the "
                          "update's sensitivity, which the accountant does not bound; set compression.up=none and "
                          "lower secagg.bits for fewer bytes")
    for name, off, why in (
            ("compression.up", "none", "a compressor's encoding is not summable modulo 2^bits"),
            ("system.async_mode", "none", "an asynchronous server step sums one update at a time"),
            ("aggregation.aggregator", "exact", "secure aggregation is itself the round's aggregator")):
        if v[name] != off:
            raise ConfigError(f"secagg.bits={bits} with {name}={v[name]}: {why}; set {name}={off} or secagg.bits=0")
    if v["secagg.neighbours"] % 2:
        raise ConfigError(f"secagg.neighbours must be even (SecAgg+'s k-regular ring graph) or 0 (complete), got "
                          f"{v['secagg.neighbours']}")
    largest = v["secagg.clip"] * 2.0 ** v["secagg.scale_bits"] * max(1, v["train.clients_per_round"]) * 2
    if largest >= 2.0**62:
        raise ConfigError(f"secagg.clip x 2^secagg.scale_bits x train.clients_per_round must stay below 2^61 (exact "
                          f"int64 sums), got {largest / 2:.3g}; lower secagg.scale_bits or secagg.clip")


def neighbour_count(cfg, clients: int) -> int:
    """How many neighbours each of `clients` clients masks with (SecAgg: all others; SecAgg+: k)."""
    k = cfg.secagg.neighbours
    return clients - 1 if k == 0 else min(k, clients - 1)


def upload_bytes(cfg, segments, clients: int) -> int:
    """A client's upload under secure aggregation: cost.upload_bytes of each secured segment (its masked
    integers and the protocol's messages, which are counted once) and the other segments' wire bytes."""
    degree = neighbour_count(cfg, clients)
    bits = cfg.secagg.bits
    masked = sum((s.numel * bits + 7) // 8 for s in segments if secured(s))
    if cfg.privacy.mechanism in ("ddgauss", "skellam"):  # one rotated vector, padded to a power of two
        masked = (padded_size(sum(s.numel for s in segments if secured(s))) * bits + 7) // 8
    protocol = cost.upload_bytes(0, bits, degree)
    return protocol + masked + sum(s.nbytes for s in segments if not secured(s))


def payload_bytes(cfg, segments, download: int) -> tuple[int, int]:
    """(download, upload) of each client of a round under secure aggregation: the server's `download` plus
    the neighbours' keys and shares (cost.download_bytes), and `upload_bytes`."""
    clients = cfg.train.clients_per_round
    return download + cost.download_bytes(neighbour_count(cfg, clients)), upload_bytes(cfg, segments, clients)


def _generator(*key: int) -> torch.Generator:
    digest = hashlib.blake2b(struct.pack(f"<{len(key)}q", *key), digest_size=8, person=b"distfl-sround").digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


class SecureAggregator(Aggregator):
    """One round's secure sum (see the module's docstring). `selected`: the clients that took part in the
    key agreement (sampled); `senders`: those whose update is summed (the round's cohort)."""

    def __init__(self, segments, device: torch.device, max_terms: int, *, cfg, round_idx: int,
                 selected: list[int], senders: list[int]):
        self.cfg, self.round_idx = cfg, round_idx
        self.bits, self.scale = cfg.secagg.bits, 2.0**cfg.secagg.scale_bits
        self.modulus = 2**self.bits
        self.secure = [s for s in segments if secured(s)]
        self.plain = StatBuffer([s for s in segments if not secured(s)], device, max_terms)
        self.index = {s.name: i for i, s in enumerate(self.secure)}
        degree = cfg.secagg.neighbours or None
        self.senders = set(senders)
        self.device = device
        self.dp = distributed_dp(cfg, padded_size(sum(s.numel for s in self.secure)))
        self.weight = None  # distributed DP: the clients' common weight, applied to the decoded sum
        if self.dp is None:  # each secured segment masked and summed on its own
            sizes = {s.name: s.numel for s in self.secure}
        else:  # one vector of all secured segments, rotated, masked as one
            self.rotation = Rotation(sum(s.numel for s in self.secure), _generator(cfg.seed, round_idx, -1))
            sizes = {"_dp": self.rotation.size}
        self.masks = {name: MaskedRound(sorted(selected), numel, self.bits, cfg.seed, round_idx, degree)
                      for name, numel in sizes.items()}
        self.masked = {name: torch.zeros(numel, dtype=torch.int64) for name, numel in sizes.items()}
        self.exact = {name: torch.zeros(numel, dtype=torch.int64) for name, numel in sizes.items()}
        self.current: list[int] = []
        self.pending: dict[int, dict[str, torch.Tensor]] = {}
        self.adds: dict[tuple[int, str], int] = {}
        self._reduced = False

    def begin(self, clients: list[int]) -> None:
        self._flush()
        self.current = list(clients)

    def _term(self, client: int, name: str, value: torch.Tensor, weight: float) -> None:
        count = self.adds.get((client, name), 0)
        self.adds[client, name] = count + 1
        if self.dp is not None:  # the update unweighted: DistributedDP clips, rounds and noises it whole
            if self.weight is None:
                self.weight = float(weight)
            elif float(weight) != self.weight:
                raise PluginError("distributed DP: every client's update must carry the same weight (uniform weighting)")
            term = value.reshape(-1).to("cpu", torch.float64)
            held = self.pending.setdefault(client, {})
            held[name] = held[name] + term if name in held else term
            return
        clip = self.cfg.secagg.clip
        x = (value.reshape(-1).to("cpu", torch.float64) * float(weight)).clamp_(-clip, clip) * self.scale
        rounded = conditional_round(x, 0.0, _generator(self.cfg.seed, self.round_idx, client, self.index[name], count))
        held = self.pending.setdefault(client, {})
        held[name] = held[name] + rounded if name in held else rounded

    def _flush(self) -> None:
        """Mask and add the pending clients' terms (each client's own sum over its adds, masked once)."""
        for client, terms in self.pending.items():
            if self.dp is not None:
                update = torch.cat([terms.get(s.name, torch.zeros(s.numel, dtype=torch.float64)) for s in self.secure])
                z = self.dp.encode(update, self.rotation, _generator(self.cfg.seed, self.round_idx, client, -2))
                self.exact["_dp"] += z
                sent = self.masks["_dp"].masked(client, torch.remainder(z, self.modulus))
                self.masked["_dp"] = torch.remainder(self.masked["_dp"] + sent, self.modulus)
                continue
            for name, term in terms.items():
                self.exact[name] += term
                sent = self.masks[name].masked(client, torch.remainder(term, self.modulus))
                self.masked[name] = torch.remainder(self.masked[name] + sent, self.modulus)
        self.pending = {}

    def _client(self, name: str) -> int:
        if len(self.current) != 1:
            raise PluginError(f"secure aggregation: a value was added to segment {name!r} outside a client's "
                              "contribution (Aggregator.begin names the client); this method cannot run with secagg")
        return self.current[0]

    def add(self, name: str, value, weight: float = 1.0) -> None:
        if self._reduced:
            raise RuntimeError("SecureAggregator.add after reduce")
        if name not in self.index:
            self.plain.add(name, value, weight)
            return
        self._term(self._client(name), name, torch.as_tensor(value), weight)

    def add_rows(self, name: str, rows: torch.Tensor, weights: list[float]) -> None:
        if name not in self.index:
            self.plain.add_rows(name, rows, weights)
            return
        if len(self.current) != len(weights):
            raise PluginError(f"secure aggregation: {len(weights)} rows added to {name!r} for "
                              f"{len(self.current)} client(s) named by Aggregator.begin")
        for client, row, weight in zip(self.current, rows.reshape(len(weights), -1), weights):
            self._term(client, name, row, weight)

    def reduce(self, ctx: dist.DistContext, name: str = "round_stats") -> "SecureSums":
        self._flush()
        self._reduced = True
        plain = self.plain.reduce(ctx, name)
        names = ["_dp"] if self.dp is not None else [s.name for s in self.secure]
        # Distributed DP: the clients' common weight, which a rank without clients learns from the others (the
        # float64's bit pattern in two 32-bit halves, summed over the ranks that have it, divided by their count).
        pattern = (torch.tensor([self.weight], dtype=torch.float64).view(torch.int64).item()
                   if self.dp is not None and self.weight is not None else None)
        weight = torch.tensor([0, 0, 0] if pattern is None else [pattern >> 32, pattern & 0xFFFFFFFF, 1])
        flat = torch.cat([self.masked[n] for n in names] + [self.exact[n] for n in names] + [weight]).to(self.device)
        dist.all_reduce_sum(flat, ctx, name=f"{name}_secagg")
        flat = flat.cpu()
        high, low, ranks = (int(v) for v in flat[-3:])
        if ranks:
            self.weight = torch.tensor([(high // ranks) << 32 | (low // ranks)]).view(torch.float64).item()
        half = self.modulus // 2
        sums, wraps, offset = {}, 0, 0
        total = sum(self.masked[n].numel() for n in names)
        survivors = len(self.senders)
        failure = None
        if survivors < self.cfg.secagg.threshold:
            failure = (f"round {self.round_idx}: secure aggregation failed: {survivors} client(s) reported, fewer than "
                       f"secagg.threshold={self.cfg.secagg.threshold}")
            if self.cfg.secagg.on_failure == "stop":
                raise SecAggFailure(f"{failure} (secagg.on_failure=stop)")
        for name in names:
            numel = self.masked[name].numel()
            masked = torch.remainder(flat[offset:offset + numel], self.modulus)
            exact = flat[total + offset:total + offset + numel]
            offset += numel
            wraps += int(((exact < -half) | (exact >= half)).sum())
            unmasked = self.masks[name].unmask(masked, self.senders)
            if self.cfg.secagg.verify and not torch.equal(unmasked, torch.remainder(exact, self.modulus)):
                raise RuntimeError(f"round {self.round_idx}: secagg.verify: the unmasked sum of segment {name} differs "
                                   "from the plain modular sum")
            if self.dp is not None:  # rotated back and unscaled, times the clients' common weight
                decoded, start = self.dp.decode(unmasked, self.rotation) * (self.weight or 0.0), 0
                for s in self.secure:
                    sums[s.name] = decoded[start:start + s.numel].to(self.device)
                    start += s.numel
                continue
            signed = torch.where(unmasked >= half, unmasked - self.modulus, unmasked)
            sums[name] = (signed.to(torch.float64) / self.scale).to(self.device)
        revealed = next(iter(self.masks.values())).revealed(self.senders) if self.masks else 0
        return SecureSums(plain, sums, {"secagg_wraps": wraps, "secagg_revealed": revealed,
                                        "secagg_survivors": survivors}, failure)

    def unit(self, name: str) -> float:
        return 1.0 / self.scale if name in self.index else self.plain.unit(name)

    @property
    def nbytes(self) -> int:
        return self.plain.nbytes + 8 * (2 * sum(m.numel() for m in self.masked.values()) + 3)


class SecureSums(Sums):
    """The plain bookkeeping sums and the decoded secure sums; `metrics` for the round's row; `failure`: the
    line saying why the round failed (fewer survivors than the threshold), else None."""

    def __init__(self, plain: Sums, secure: dict, metrics: dict, failure: str | None):
        self.plain, self.secure, self.failure = plain, secure, failure
        self._metrics = {**metrics, **({"secagg_failed": 1} if failure else {})}

    @property
    def metrics(self) -> dict:
        return self._metrics

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.secure[name].clone() if name in self.secure else self.plain[name]

    def problems(self) -> dict[str, str]:
        return self.plain.problems()


def distributed_dp(cfg, dim: int) -> DistributedDP | None:
    """The clients' side of distributed DP (privacy.mechanism=ddgauss|skellam), or None: each client's noise
    has stddev noise_multiplier x clip_norm / sqrt(clients_per_round) in model units, so the expected
    cohort's noise adds up to the central mechanism's noise_multiplier x clip_norm. `dim`: the padded
    dimension of the rotated update (the calibration's sensitivity depends on it)."""
    p = cfg.privacy
    if p.mechanism not in ("ddgauss", "skellam"):
        return None
    return _distributed_dp(cfg, noise_multiplier(cfg, dim))


def _distributed_dp(cfg, z: float) -> DistributedDP:
    p = cfg.privacy
    return _client_noise(p.mechanism, p.clip_norm, cfg.secagg.bits, cfg.secagg.scale_bits, cfg.train.clients_per_round, z)


def _client_noise(mechanism: str, clip: float, bits: int, scale_bits: int, clients: int, z: float) -> DistributedDP:
    return DistributedDP(mechanism, clip, bits, 2.0**scale_bits, z * clip / math.sqrt(clients))


def epsilon(dp: DistributedDP, survivors: int, dim: int, rounds: int, delta: float) -> float:
    """Epsilon after `rounds` rounds whose sums each held the noise of at least `survivors` clients."""
    from ..privacy import distributed_accounting as accounting

    if not rounds:
        return 0.0
    if survivors == 0 or dp.local_sigma == 0:
        return math.inf
    common = dict(scale=dp.scale, l2_clip=dp.l2_clip, beta=dp.beta, dim=dim, q=1.0, steps=rounds, delta=delta)
    if dp.mechanism == "ddgauss":
        return accounting.ddgauss_epsilon(local_sigma=dp.local_sigma, num_clients=survivors, **common)
    return accounting.skellam_epsilon(central_sigma=math.sqrt(survivors) * dp.local_sigma, **common)


def calibration_survivors(cfg) -> int:
    """The survivors a round is calibrated for: every client of the round (train.clients_per_round) when all
    report (no system model, fixed-size cohorts), else secagg.threshold, the fewest a round that is summed
    (and counted) can have."""
    from .. import system

    if system.enabled(cfg) or cfg.train.cohort == "poisson":
        return cfg.secagg.threshold
    return cfg.train.clients_per_round


def noise_multiplier(cfg, dim: int) -> float:
    """privacy.noise_multiplier, or the smallest one (to 1e-4 relative) whose train.rounds rounds spend at most
    privacy.target_epsilon at delta with `calibration_survivors` clients' noise in each sum."""
    p = cfg.privacy
    if p.target_epsilon <= 0:
        return float(p.noise_multiplier)
    setting = (p.mechanism, p.clip_norm, cfg.secagg.bits, cfg.secagg.scale_bits, cfg.train.clients_per_round)
    return _calibrated(setting, p.delta, dim, p.target_epsilon, cfg.train.rounds, calibration_survivors(cfg))


@functools.lru_cache(maxsize=16)
def _calibrated(setting: tuple, delta: float, dim: int, target: float, rounds: int, survivors: int) -> float:
    from ..privacy.distributed_accounting import calibrate

    def spent(z):
        return epsilon(_client_noise(*setting, z), survivors, dim, rounds, delta)

    try:
        return calibrate(spent, target)
    except ValueError as exc:
        mechanism, _, bits, scale_bits, _ = setting
        raise ConfigError(f"privacy.target_epsilon={target:g} is out of reach for privacy.mechanism={mechanism} at "
                          f"secagg.bits={bits}, secagg.scale_bits={scale_bits} over {rounds} rounds with {survivors} "
                          f"survivors a round: {exc} (the rounding's sensitivity grows as scale_bits falls; raise it "
                          "or the target)") from None


class DistributedLedger:
    """Epsilon of distributed DP after t rounds (privacy/distributed_accounting.py), with the fewest
    survivors of any round so far (the least noise a round's sum held: a bound for every round), without
    sampling amplification (q = 1: the cohorts are not Poisson samples from a secret key). `progress()`:
    the run's progress dict, where the fewest survivors is kept through checkpoints."""

    def __init__(self, cfg, segments, progress):
        from ..federation.aggregate import round_segments

        self.cfg, self.progress = cfg, progress
        numel = sum(s.numel for s in round_segments(segments, 1) if secured(s))
        self.dim = padded_size(numel)
        self.noise_multiplier = noise_multiplier(cfg, self.dim)  # calibrated here, before any round
        self.dp = distributed_dp(cfg, self.dim)

    def record_round(self, reduced) -> None:
        """A round summed: its survivors' noise is what it holds."""
        survivors = int(reduced.metrics["secagg_survivors"])
        fewest = self.progress().get("secagg_fewest_survivors")
        self.progress()["secagg_fewest_survivors"] = survivors if fewest is None else min(fewest, survivors)

    def epsilon_after(self, rounds: int) -> float:
        n = self.progress().get("secagg_fewest_survivors")
        if not rounds or n is None:
            return 0.0
        return epsilon(self.dp, n, self.dim, rounds, self.cfg.privacy.delta)

    def describe(self) -> str:
        """The run's distributed-DP set-up, one line (printed at start)."""
        p, rounds = self.cfg.privacy, self.cfg.train.rounds
        survivors = calibration_survivors(self.cfg) if p.target_epsilon > 0 else self.cfg.train.clients_per_round
        planned = epsilon(self.dp, survivors, self.dim, rounds, p.delta)
        origin = (f"calibrated to target_epsilon={p.target_epsilon:g}" if p.target_epsilon > 0
                  else "privacy.noise_multiplier")
        return (f"privacy: user-level distributed DP ({p.mechanism}) under secure aggregation, clip {p.clip_norm:g}, "
                f"noise multiplier {self.noise_multiplier:.4g} ({origin}; each client's stddev {self.dp.local_sigma:.4g}), "
                f"{self.cfg.secagg.bits} bits, scale 2^{self.cfg.secagg.scale_bits}; {rounds} rounds with {survivors} "
                f"survivors each give epsilon {planned:.4g} at delta {p.delta:g}; simulation: noise reproducible "
                "from the config")

    def guarantee(self, rounds: int) -> dict:
        """summary.json's privacy entry, as central DP's."""
        eps = self.epsilon_after(rounds)
        p = self.cfg.privacy
        return {"mechanism": p.mechanism, "epsilon": eps if math.isfinite(eps) else None, "delta": p.delta,
                "rounds": rounds, "noise_multiplier": self.noise_multiplier,
                "calibrated": p.target_epsilon > 0, "target_epsilon": p.target_epsilon or None,
                "calibration_survivors": calibration_survivors(self.cfg) if p.target_epsilon > 0 else None,
                "clip_norm": p.clip_norm,
                "local_sigma": self.dp.local_sigma, "bits": self.cfg.secagg.bits, "scale": self.dp.scale,
                "beta": self.dp.beta, "dimension": self.dim, "sampling_rate": 1.0,
                "fewest_survivors": self.progress().get("secagg_fewest_survivors"),
                "level": "user", "model": "distributed", "noise": "keyed",
                "accountant": f"{p.mechanism} RDP with the fewest survivors", "cohort": "unamplified"}

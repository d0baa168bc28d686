"""The system model: each client's compute speed, bandwidths and availability, and the time its work takes.

Every value is a pure function of the run's seed, the client (and the round, or the virtual time) and the
`system` config, so every rank computes the same ones without talking, and a resumed run the same again.
Draws come from a counter-based hash (`keyed_uniform`), not a stream: client 7's speed is the same in a
population of 10 clients or of 10 million, and computing it never shifts another draw.

Units are FedScale's (fedscale/cloud/internal/client_metadata.py): compute in ms per sample's forward
pass, training a sample takes `compute_factor` (3) times that; bandwidth in kbit/s with 1 kbit = 1024
bits, and a transfer takes its bytes x 8 / 1024 kbit over it: the download what the server sends a client
(the global model, and what else the method sends), the upload what the client sends back (the segments
of its contribution, as encoded: federation/aggregate.py, Segment.wire_bytes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError
from . import traces

# Distinct keys for distinct quantities, so adding one never changes another's draws.
SPEED, DOWNLOAD, UPLOAD, DROPOUT, DIURNAL, COHORT, LIST_PICK, STRAGGLER, STRAGGLER_EPOCHS = 1, 2, 3, 4, 5, 6, 7, 8, 9

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def keyed_uniform(seed: int, key: int, *index) -> np.ndarray:
    """Uniform floats in (0, 1), one per element of the broadcast `index` arrays (client ids, rounds):
    a hash of (seed, key, *index), so each value depends on nothing else."""
    with np.errstate(over="ignore"):
        h = _mix(np.uint64((seed * _GOLDEN + key) & _MASK) + np.uint64(_GOLDEN))
        for part in index:
            h = _mix(h ^ (np.asarray(part, dtype=np.uint64) + np.uint64(_GOLDEN)))
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


@dataclass(frozen=True)
class Spec:
    """A per-client value: constant:V | uniform:LO,HI | lognormal:MU,SIGMA | list:V1,V2,..."""

    kind: str
    values: tuple

    def draw(self, seed: int, key: int, clients: np.ndarray) -> np.ndarray:
        if self.kind == "constant":
            return np.full(len(clients), self.values[0], dtype=np.float64)
        u = keyed_uniform(seed, key, clients)
        if self.kind == "uniform":
            low, high = self.values
            return low + (high - low) * u
        if self.kind == "lognormal":
            mu, sigma = self.values
            import torch

            normal = torch.special.ndtri(torch.from_numpy(u)).numpy()
            return np.exp(mu + sigma * normal)
        pick = np.minimum((u * len(self.values)).astype(np.int64), len(self.values) - 1)
        return np.asarray(self.values, dtype=np.float64)[pick]


# The keyed draws reach z = ndtri(2^-54) = -8.3 (and +8.3); exp() of more than 709 is inf and of less
# than -708 rounds towards 0 (a zero bandwidth divides by zero).
LOGNORMAL_REACH, LOGNORMAL_EXPONENT = 9, 700


def parse_spec(key: str, text: str, allow_inf: bool = False) -> Spec:
    """`text` as a Spec; ValueError with one line naming `key` and the valid forms."""
    valid = (f"{key} must be constant:V, uniform:LO,HI, lognormal:MU,SIGMA or list:V1,V2,... with positive values"
             f"{' (inf: unlimited)' if allow_inf else ''}, got {text!r}")
    kind, _, rest = text.partition(":")
    try:
        values = tuple(float(v) for v in rest.split(",")) if rest.strip() else ()
    except ValueError:
        raise ValueError(valid) from None
    counts = {"constant": 1, "uniform": 2, "lognormal": 2}
    if kind not in (*counts, "list") or (kind in counts and len(values) != counts[kind]) or not values:
        raise ValueError(valid)
    if any(math.isnan(v) for v in values):
        raise ValueError(valid)
    if kind == "lognormal":
        if not all(math.isfinite(v) for v in values) or values[1] < 0:
            raise ValueError(valid + " (lognormal: a finite MU and SIGMA >= 0)")
        if abs(values[0]) + LOGNORMAL_REACH * values[1] > LOGNORMAL_EXPONENT:
            raise ValueError(valid + f" (lognormal: |MU| + {LOGNORMAL_REACH} SIGMA <= {LOGNORMAL_EXPONENT}, so that "
                             "every client's exp(MU + SIGMA z) is a positive finite number)")
    elif any(v <= 0 or (math.isinf(v) and not allow_inf) for v in values):
        raise ValueError(valid)
    if kind == "uniform" and values[0] > values[1]:
        raise ValueError(valid + " (uniform: LO <= HI)")
    return Spec(kind, values)


class SystemModel:
    """Per-client speeds and bandwidths (arrays over the population), availability, dropouts, durations."""

    def __init__(self, cfg, num_clients: int, download_bytes: int, upload_bytes: int, compute_scale: float = 1.0):
        s = cfg.system
        self.seed, self.cfg = cfg.seed, s
        clients = np.arange(num_clients, dtype=np.int64)
        if s.capacity_file:
            profiles = traces.read_capacity(s.capacity_file)
            self.ms_per_sample, self.download = traces.capacities_for(profiles, num_clients)
            self.upload = self.download
        else:
            self.ms_per_sample = parse_spec("system.speed", s.speed).draw(self.seed, SPEED, clients)
            self.download = parse_spec("system.bandwidth", s.bandwidth, True).draw(self.seed, DOWNLOAD, clients)
            self.upload = (self.download if s.upload_bandwidth == "same" else
                           parse_spec("system.upload_bandwidth", s.upload_bandwidth, True).draw(self.seed, UPLOAD, clients))
        self.ms_per_sample = self.ms_per_sample * compute_scale  # system.reference_flops
        self.download_kbit = download_bytes * 8 / 1024
        self.upload_kbit = upload_bytes * 8 / 1024
        self.behaviour = None
        if s.availability == "trace":
            self.behaviour = traces.behaviour_for(traces.read_behaviour(s.trace_file), num_clients)
            if not any(b.intervals for b in self.behaviour):
                raise ConfigError(f"{s.trace_file}: none of the entries that FedScale's mapping gives this run's "
                                  f"{num_clients} clients has an online interval (active[i] <= inactive[i], "
                                  "active[i] < finish_time), so no client would ever be online")
        self.phase = None
        if s.availability == "diurnal":
            self.phase = keyed_uniform(self.seed, DIURNAL, clients) * s.diurnal_period_s

    def compute_s(self, client: int, samples: int) -> float:
        """Seconds of local training over `samples` samples (a sample counts once per batch it is in)."""
        return self.cfg.compute_factor * samples * float(self.ms_per_sample[client]) / 1000.0

    def download_s(self, client: int) -> float:
        return self.download_kbit / float(self.download[client])

    def upload_s(self, client: int) -> float:
        return self.upload_kbit / float(self.upload[client])

    def duration_s(self, client: int, samples: int) -> float:
        """Download the model (and the method's other state), train on `samples` samples, upload the contribution."""
        return self.download_s(client) + self.compute_s(client, samples) + self.upload_s(client)

    def online(self, clients, t: float) -> np.ndarray:
        """Whether each client is online at virtual time `t` (seconds since the run began)."""
        clients = np.asarray(clients, dtype=np.int64)
        s = self.cfg
        if self.phase is not None:
            return np.mod(t - self.phase[clients], s.diurnal_period_s) < s.diurnal_online * s.diurnal_period_s
        if self.behaviour is not None:
            return np.array([self.behaviour[int(c)].online(t) for c in clients], dtype=bool)
        return np.ones(len(clients), dtype=bool)

    def next_online(self, t: float, clients=None) -> float:
        """The earliest time >= t at which some client (of `clients`; default: all) is online (t itself under
        availability=always; inf if none of them is ever online)."""
        s = self.cfg
        if self.phase is not None:
            phase = self.phase if clients is None else self.phase[np.asarray(clients, dtype=np.int64)]
            since = np.mod(t - phase, s.diurnal_period_s)
            waits = np.where(since < s.diurnal_online * s.diurnal_period_s, 0.0, s.diurnal_period_s - since)
            return t + float(waits.min()) if len(waits) else math.inf
        if self.behaviour is not None:
            behaviour = self.behaviour if clients is None else [self.behaviour[int(c)] for c in clients]
            return min((b.next_online(t) for b in set(behaviour)), default=math.inf)
        return t

    def stragglers(self, round_idx: int, clients, epochs: int) -> dict[int, int]:
        """FedProx's stragglers among a round's sampled `clients` (Li et al. 2020, Section 5.2, as the authors'
        trainers draw them): k - round(k (1 - share)) of the k, those with the smallest keyed draws (seed, round,
        client), each managing an epoch count uniform in 1 .. epochs - 1, keyed by (seed, round, client).
        Client -> its epochs."""
        clients = np.asarray(clients, dtype=np.int64)
        count = len(clients) - round(len(clients) * (1 - self.cfg.stragglers))
        if count <= 0:
            return {}
        order = np.lexsort((clients, keyed_uniform(self.seed, STRAGGLER, round_idx, clients)))
        chosen = clients[order[:count]]
        u = keyed_uniform(self.seed, STRAGGLER_EPOCHS, round_idx, chosen)
        done = 1 + np.minimum((u * (epochs - 1)).astype(np.int64), epochs - 2)
        return {int(c): int(e) for c, e in zip(chosen, done)}

    def drops(self, round_idx: int, clients) -> np.ndarray:
        """Whether each client drops out in round `round_idx` (keyed by (seed, round, client))."""
        clients = np.asarray(clients, dtype=np.int64)
        if self.cfg.dropout <= 0:
            return np.zeros(len(clients), dtype=bool)
        return keyed_uniform(self.seed, DROPOUT, round_idx, clients) < self.cfg.dropout

"""The Gaussian mechanism of DP-FedAvg inside distfl's round (McMahan, Ramage, Talwar and Zhang,
"Learning Differentially Private Recurrent Language Models", ICLR 2018, Algorithm 1).

Per client (on its rank): everything the method's `collect` adds to the round's released segments is
staged; its contribution is what those adds sum to, segment by segment (a segment added twice counts
twice), and its norm is m times the L2 norm of those weighted per-segment sums (accumulated in float64).
Every add must carry the weight 1 / m, m = train.clients_per_round, the expected cohort size (a fixed
denominator, as in the paper, so no client's weight depends on who else was sampled): another weight is
refused. The whole contribution is scaled by (C - r) / norm if its norm exceeds C - r (else added
untouched) before it is rounded into the fixed-point sum; r bounds what that rounding can add to the norm
(half a unit per coordinate and add), so the contribution as summed has norm <= C.

Per round (on every rank, after the one all_reduce): N(0, (z_Delta C)^2) on every coordinate of the
summed contributions, divided by m, drawn from (key, round) on the run's device: from AES-128-CTR under the
run's secret key (privacy.secure_noise, secret.py, csprng.py) or, in keyed mode, from a torch generator
seeded by the config's seed and the round.
Every rank draws the same noise, so the noisy model is the same on any number of ranks and after a
resume. The server step that follows is post-processing.

Beside the model a private run releases (metrics.jsonl, TensorBoard, summary.json) nothing computed from
the clients' data without noise: the round's train loss, sample count (samples_per_s) and bytes (bytes_up,
bytes_down: they count the clients) are WITHHELD.
"""
from __future__ import annotations

import math

import torch

from ..errors import PluginError
from ..federation import population as _population
from . import csprng, secret
from .adaptive import AdaptiveClip, count_noise_std, update_noise_multiplier
from .banded import BandedFactorisation, bands
from .tree import TreeAggregation, rounds_per_tree

_NOISE_STREAM = 11  # beside population.py's streams: the round's noise never shifts a cohort or a client
_UPDATE_NOISE, _COUNT_NOISE = 0, 1
# Secret cohorts: the CSPRNG's domain of each rule, population.py's stream numbers.
_COHORT_DOMAIN = {"random": _population._COHORT_STREAM, "poisson": _population._POISSON_STREAM}
# Round metrics that are exact aggregates of the sampled clients (their losses, their sample counts): not
# logged under DP.
WITHHELD = ("train_loss", "samples_per_s", "bytes_up", "bytes_down")
UNCLIPPED = "privacy_unclipped"  # adaptive clipping: the sum of the clients' centred reports


def standard_normal(key: secret.NoiseKey, round_idx: int, purpose: int, numel: int, device: torch.device) -> torch.Tensor:
    return key.normal([_NOISE_STREAM, round_idx, purpose], (_NOISE_STREAM, purpose, round_idx), numel, device)


class _Staged:
    """Stands in for the round's StatBuffer while one client's statistics are collected."""

    def __init__(self, released: dict):
        self.released, self.parts = released, []

    def add(self, name, value, weight: float = 1.0) -> None:
        if name not in self.released:
            raise ValueError(f"under differential privacy (privacy.mechanism) a client may only add to the released segments "
                             f"({', '.join(self.released)}), not {name!r}")
        self.parts.append((name, torch.as_tensor(value), weight))


class GaussianMechanism:
    def __init__(self, cfg, algorithm_segments, noise_multiplier: float, device: torch.device, ctx=None):
        """`ctx`: the process group a secret key is sent through (None: one process)."""
        p = cfg.privacy
        self.key = secret.NoiseKey(p.secure_noise, secret.draw(ctx) if p.secure_noise else cfg.seed)
        self.device = device
        self.noise_multiplier = noise_multiplier  # z, what the accountant sees
        self.denominator = cfg.train.clients_per_round
        self.released = {s.name: s for s in algorithm_segments}  # all "fixed" (rules.py refuses others)
        self.algorithm_name = cfg.algorithm.name
        self.numel = sum(s.numel for s in algorithm_segments)
        self.clip = AdaptiveClip(p.clip_norm, p.target_quantile, p.clip_lr,
                                 count_noise_std(p.count_noise_multiplier, self.denominator), self.denominator) \
            if p.adaptive_clip else None
        self.fixed_clip = p.clip_norm
        # dp_ftrl: the noise of round t is the change in the tree's noise on the prefix sum (tree.py).
        self.tree = (TreeAggregation(rounds_per_tree(cfg.partition.num_clients, self.denominator))
                     if p.mechanism == "dp_ftrl" else None)
        # banded_mf: the round's row of C^-1 Z for the factorisation of all train.rounds rounds (banded.py).
        self.banded = (BandedFactorisation(cfg.train.rounds, bands(cfg)) if p.mechanism == "banded_mf" else None)
        self.correlated = self.tree or self.banded
        self.update_multiplier = (update_noise_multiplier(noise_multiplier, self.clip.count_std)
                                  if self.clip else noise_multiplier)
        self.metrics: dict[str, float] = {}

    def cohort(self, population, round_idx: int, size: int, rule: str) -> list[int]:
        """Round `round_idx`'s clients: in secret mode a random or Poisson cohort from the CSPRNG under the
        key (csprng.py); otherwise (keyed mode, or the sequential rule, which draws nothing) from the seed."""
        if self.key.secret and rule in _COHORT_DOMAIN:
            return csprng.cohort(self.key.value, _COHORT_DOMAIN[rule], round_idx, len(population), size, rule)
        return population.cohort(self.key.value, round_idx, size, rule)

    @property
    def clip_norm(self) -> float:
        return self.clip.clip_norm if self.clip else self.fixed_clip

    def weight(self) -> float:
        return 1.0 / self.denominator

    def segments(self) -> list:
        from ..federation.aggregate import Segment

        # |b_i - 1/2| = 1/2 bounds a term, which sets the unit (exact far beyond any cohort).
        return [Segment(UNCLIPPED, 1, bound=0.5)] if self.clip else []

    def collect(self, algorithm, run, worker, stats) -> float:
        """The method's statistics of one client, clipped jointly, into `stats`; returns the norm before
        clipping. One host sync a client (the norm), as StatBuffer.add's range check already has."""
        staged = _Staged(self.released)
        algorithm.client_statistics(run, worker, staged)
        weight, summed, adds = self.weight(), {}, {}
        for name, value, w in staged.parts:
            if w != weight:
                raise PluginError(f"under differential privacy (privacy.mechanism) every contribution is weighted 1 / "
                                  f"train.clients_per_round = {weight:g} (run.weight), but algorithm.name="
                                  f"{self.algorithm_name} added {name!r} with weight {w:g}; the clip and the "
                                  "accountant assume that fixed denominator")
            value = value.reshape(-1)
            summed[name] = summed[name].to(torch.float64) + value.to(torch.float64) if name in summed else value
            adds[name] = adds.get(name, 0) + 1
        # Every add has the same weight: the norm of the unweighted per-segment sums is the contribution's.
        norm = math.sqrt(sum(float(torch.linalg.vector_norm(total, dtype=torch.float64)) ** 2
                             for total in summed.values()))
        # Each add rounds to half a unit of the fixed point per coordinate, in the units of the unweighted value.
        slack = math.sqrt(sum(self.released[name].numel * (k * stats.unit(name) / 2 / weight) ** 2
                              for name, k in adds.items()))
        limit = self.clip_norm - slack
        for name, value, weight in staged.parts:
            # Within the clip: added exactly as without DP (bit for bit). Beyond it: scaled onto it.
            stats.add(name, value if norm <= limit else value.to(torch.float64) * (limit / norm), weight)
        if self.clip:
            stats.add(UNCLIPPED, self.clip.indicator(norm))
        return norm

    def privatize(self, reduced, round_idx: int):
        """The reduced sums with the round's noise on the released segments; adapts the clip."""
        clip_used = self.clip_norm
        noisy = {}
        if self.update_multiplier > 0:
            noise = (self.correlated.round_noise(self.key, round_idx, self.numel, self.device) if self.correlated else
                     standard_normal(self.key, round_idx, _UPDATE_NOISE, self.numel, self.device))
            std = self.update_multiplier * clip_used / self.denominator
            offset = 0
            for name, seg in self.released.items():
                noisy[name] = reduced[name] + noise[offset : offset + seg.numel] * std
                offset += seg.numel
        self.metrics = {"privacy_clip_norm": clip_used}
        if self.clip:
            count_noise = standard_normal(self.key, round_idx, _COUNT_NOISE, 1, self.device)
            self.metrics["privacy_unclipped_fraction"] = self.clip.update(reduced[UNCLIPPED][0], count_noise[0])
        return NoisyReduced(reduced, noisy)

    def state_dict(self) -> dict:
        """Server state for the checkpoint; a secret key goes beside it (`write_key`), never in it."""
        return {"noise": self.key.mode, **(self.clip.state_dict() if self.clip else {})}

    def checkpoint(self, checkpoint_dir) -> dict:
        """Rank 0, writing a checkpoint: a secret key into `checkpoint_dir` (owner-only); the state."""
        secret.write(self.key, checkpoint_dir)
        return self.state_dict()

    def load_state_dict(self, state: dict, checkpoint_dir=None) -> None:
        """`checkpoint_dir`: where a secret key was written (resume)."""
        key = secret.restored(self.key.secret, state.get("noise"), checkpoint_dir)
        if key is not None:
            self.key = key
        if self.clip:
            self.clip.load_state_dict(state)


class NoisyReduced:
    """The reduced sums as the server step reads them, the noised segments replaced."""

    def __init__(self, reduced, noisy: dict):
        self._reduced, self._noisy = reduced, noisy

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._noisy[name].clone() if name in self._noisy else self._reduced[name]

    def scalar(self, name: str) -> float:
        return float(self[name][0])

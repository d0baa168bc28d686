"""Compressed updates around a method (`compression.up`; docs/compression.md; the compressors, one file
each beside its paper, in distfl/compression).

Each client compresses the update segments its method adds (FedAvg's, FedProx's and FedDyn's `delta`,
SCAFFOLD's `delta` and `control_delta`) before they travel; the server decodes and adds the decoded
vector into the round's exact sum with the client's weight, as it would the raw update. What the server
sums is therefore what a decoding server would average, and the sum keeps its guarantees: every random
choice of a compressor comes from a generator keyed by (seed, round, client, segment), never from the
rank, so a compressed run is the same on 1 or N ranks, in packs and after a resume.

- Bytes: each compressed segment's wire bytes are its compressor's closed-form size (the virtual clock's
  upload and `bytes_up` read them).
- Error feedback (`compression.error_feedback`): the client keeps p - C(p) of each segment in its state
  (memory or disk, checkpointed) and adds it to its next update before compressing.
- PowerSGD keeps each weight's warm-start Q in the client's state.
- `compression_vnmse`: the mean over the round's clients of ||C(x) - x||^2 / ||x||^2 of their delta
  (withheld under DP: it is computed from each client's update without noise).
Under DP (privacy.mechanism) the wrapper sits inside the mechanism: the decoded update is what is clipped
and noised.
"""
from __future__ import annotations

import torch

from ..compression import ErrorFeedback, PowerSGD, build, keyed_generator
from ..compression.base import Compressed as Message
from ..errors import ConfigError
from ..federation.aggregate import Segment
from .base import flat_views
from .feature import Feature

# The methods whose clients send only their model update, and the segments that carry it.
UPDATE_SEGMENTS = {"fedavg": ("delta",), "fedprox": ("delta",), "feddyn": ("delta",),
                   "scaffold": ("delta", "control_delta")}
_KEY = 0xC0DEC  # keeps the compressors' streams apart from every other keyed stream of the run
ERROR = "compression_vnmse"


def check_config(v: dict) -> None:
    """One line for a compression setting no run can serve (called by config validation)."""
    up = v["compression.up"]
    if up == "none":
        return
    method = v["algorithm.name"]
    if method not in UPDATE_SEGMENTS:
        raise ConfigError(f"compression.up={up} compresses a model update; algorithm.name={method} sends more than its "
                          f"update or uses it otherwise: use one of {', '.join(UPDATE_SEGMENTS)}")
    if v["aggregation.mask"] == "gma":
        raise ConfigError(f"compression.up={up} with aggregation.mask=gma: GMA's sign agreement is defined on the raw "
                          "updates, not on what a compressor sends; use one or the other")
    if v["system.async_mode"] != "none" and (v["compression.error_feedback"] or up == "powersgd"):
        what = "compression.error_feedback=true" if v["compression.error_feedback"] else "compression.up=powersgd"
        raise ConfigError(f"{what} keeps state in each client between rounds, which an asynchronous run "
                          f"(system.async_mode={v['system.async_mode']}) does not keep; compress without it")
    if up == "qsgd" and v["compression.bits"] < 2:
        raise ConfigError(f"compression.bits must be >= 2 for compression.up=qsgd (a sign bit and a level), got "
                          f"{v['compression.bits']}")
    if up == "eden" and v["compression.bits"] > 8:
        raise ConfigError(f"compression.bits must be at most 8 for compression.up=eden, got {v['compression.bits']}")


def build_compressor(cfg):
    c = cfg.compression
    options = {"topk": dict(density=c.density), "randk": dict(density=c.density, rescale=c.unbiased),
               "qsgd": dict(bits=c.bits), "drive": dict(unbiased=c.unbiased, rotation=c.rotation),
               "eden": dict(bits=c.bits, unbiased=c.unbiased, rotation=c.rotation), "powersgd": dict(rank=c.rank)}
    if c.up == "powersgd":
        return PowerSGD(**options["powersgd"])
    return build(c.up, **options.get(c.up, {}))


class Compressed(Feature):
    feature_name = "compression"
    keys = ("compression.up", "compression.density", "compression.bits", "compression.rank", "compression.rotation",
            "compression.unbiased", "compression.error_feedback")
    order = 30  # outside GMA and FedBN; inside DP, which clips and noises the decoded update

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.compression.up not in ("none", "sketch")  # sketch: FetchSGD's own feature (sketched.py)

    @classmethod
    def refuse(cls, v: dict, method: type) -> None:
        check_config(v)

    def __init__(self, inner, cfg, setting):
        super().__init__(inner, cfg, setting)
        names = UPDATE_SEGMENTS[cfg.algorithm.name]
        # Under DP (a private feature around it) the per-client error is not reported: it is unnoised.
        report_error = not any(feature.private for feature in setting.features)
        self._own(compressor=build_compressor(cfg), names=names, feedback=cfg.compression.error_feedback,
                  seed=cfg.seed, round_idx=0, report_error=report_error, views=flat_views(setting.worker), vnmse=None)

    # ---- what travels ---------------------------------------------------------------------------
    def encoded_bytes(self, segment: Segment) -> int | None:
        return (self._bits(segment) + 7) // 8 if segment.name in self.names else None

    def added_segments(self) -> list[Segment]:
        return [Segment(ERROR, 1, wire_bytes=0)] if self.report_error else []

    def _bits(self, segment: Segment) -> int:
        if isinstance(self.compressor, PowerSGD):
            return sum(self.compressor.bits_of(tuple(shape)) for _, _, shape in self.views)
        return self.compressor.bits(segment.numel)

    # ---- client side ----------------------------------------------------------------------------
    @property
    def stateful(self) -> bool:
        return self.feedback or isinstance(self.compressor, PowerSGD) or self.inner.stateful

    def init_client_state(self) -> dict:
        state = dict(self.inner.init_client_state())
        if self.feedback:
            for segment in self.inner.segments():
                if segment.name in self.names:
                    state[f"compression_residual.{segment.name}"] = torch.zeros(segment.numel, device=self.device)
        return state

    def begin_round(self, round_idx: int) -> None:
        self.round_idx = round_idx
        self.inner.begin_round(round_idx)

    def client_statistics(self, run, worker, stats) -> None:
        staged = _Staged(stats, self.names)
        self.inner.client_statistics(run, worker, staged)
        for name, value, weight in staged.parts:
            x = value.reshape(-1).to(torch.float32)
            key = (self.seed, _KEY, run.round_idx, run.client_id, self.names.index(name))
            sent, raw = self._send(x, name, run.state, key)
            stats.add(name, sent, weight)
            if name == "delta" and self.report_error:
                norm = float(raw.square().sum())
                stats.add(ERROR, float((sent.to(torch.float64) - raw.to(torch.float64)).square().sum()) / norm
                          if norm > 0 else 0.0)

    def _send(self, x: torch.Tensor, name: str, state: dict, key) -> tuple[torch.Tensor, torch.Tensor]:
        """(the decoded vector the server adds, the vector that was compressed)."""
        residual_key = f"compression_residual.{name}"
        corrected = x + state[residual_key] if self.feedback else x
        if isinstance(self.compressor, PowerSGD):
            decoded = self._powersgd(corrected, name, state, key)
        else:
            decoded = self.compressor.compress(corrected, keyed_generator(*key) if self.compressor.random else None).decoded
        if self.feedback:
            state[residual_key] = corrected - decoded
        return decoded, corrected

    def _powersgd(self, x: torch.Tensor, name: str, state: dict, key) -> torch.Tensor:
        out = torch.empty_like(x)
        generator = keyed_generator(*key)
        for param, where, shape in self.views:
            q_key = f"compression_q.{name}.{param}"
            message, q = self.compressor.compress_matrix(x[where].view(shape), state.get(q_key), generator)
            out[where] = message.decoded.reshape(-1)
            if q is not None:
                state[q_key] = q
        return out

    # ---- server side ----------------------------------------------------------------------------
    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        self.inner.server_update(params, buffers, reduced)
        if self.report_error:
            clients = reduced.scalar("clients")
            self.vnmse = reduced.scalar(ERROR) / clients if clients else None

    @property
    def round_metrics(self) -> dict:
        extra = {ERROR: self.vnmse} if self.vnmse is not None else {}
        return {**self.inner.round_metrics, **extra}


class _Staged:
    """Stands in for the round's aggregator while the method adds a client's statistics: holds the adds
    to the update segments (to compress them), passes every other add through."""

    def __init__(self, stats, names):
        self.stats, self.names, self.parts = stats, names, []

    def add(self, name, value, weight=1.0):
        if name in self.names:
            self.parts.append((name, value, weight))
        else:
            self.stats.add(name, value, weight)

    def __getattr__(self, name):
        return getattr(self.stats, name)

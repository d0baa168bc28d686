"""The round's aggregator, chosen in this one place from `aggregation.aggregator` (docs/extending.md, An
aggregator): `exact` (federation/aggregate.py's StatBuffer) or a plugin's Aggregator subclass."""
from __future__ import annotations

import torch

from ..plugins import load_plugin
from .aggregate import Aggregator, StatBuffer, round_segments, wire_bytes


def round_aggregator(cfg, algorithm_segments, max_samples_trained: int, device: torch.device, max_terms: int,
                     round_idx: int = 0, sampled=(), senders=()) -> Aggregator:
    """The round's aggregator over the round's segments (`round_segments`): the one place a run's sums are
    built. Secure aggregation (secagg.bits, docs/secagg.md) when it is on: the `sampled` clients mask, the
    `senders` report; else the class `aggregation.aggregator` names."""
    segments = round_segments(algorithm_segments, max_samples_trained)
    if cfg.secagg.bits:
        from ..secagg.aggregator import SecureAggregator

        return SecureAggregator(segments, device, max_terms, cfg=cfg, round_idx=round_idx, selected=list(sampled),
                                senders=list(senders))
    return aggregator_class(cfg.aggregation.aggregator)(segments, device, max_terms)


def aggregator_class(name: str) -> type:
    """The Aggregator class `name` (aggregation.aggregator) refers to: exact, or an import path."""
    if name == "exact":
        return StatBuffer
    return load_plugin("aggregation.aggregator", name)


def payload_bytes(cfg, algorithm) -> tuple[int, int]:
    """What each client of a round downloads and uploads, in bytes: the segments the server sends it
    (`download_segments`) and those it sends back (`segments`), at their wire sizes; under secure
    aggregation, what its protocol sends (secagg/aggregator.py)."""
    down, up = wire_bytes(algorithm.download_segments()), wire_bytes(algorithm.segments())
    if cfg.secagg.bits:
        from ..secagg.aggregator import payload_bytes as secure_payload_bytes

        return secure_payload_bytes(cfg, algorithm.segments(), down)
    return down, up

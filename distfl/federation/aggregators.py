"""The round's aggregator, chosen in this one place from `aggregation.aggregator` (docs/extending.md, An
aggregator): `exact` (federation/aggregate.py's StatBuffer) or a plugin's Aggregator subclass."""
from __future__ import annotations

import torch

from ..plugins import load_plugin
from .aggregate import Aggregator, StatBuffer, round_segments


def round_aggregator(cfg, algorithm_segments, max_samples_trained: int, device: torch.device,
                     max_terms: int) -> Aggregator:
    """The round's aggregator, of the class `aggregation.aggregator` names, over the round's segments
    (`round_segments`): the one place a run's sums are built."""
    return aggregator_class(cfg.aggregation.aggregator)(round_segments(algorithm_segments, max_samples_trained),
                                                        device, max_terms)


def aggregator_class(name: str) -> type:
    """The Aggregator class `name` (aggregation.aggregator) refers to: exact, or an import path."""
    if name == "exact":
        return StatBuffer
    return load_plugin("aggregation.aggregator", name)

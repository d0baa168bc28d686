"""Before the run directory exists: does the model fit the data? One small batch through a CPU copy of
the freshly built model (no gradients, so nothing of the run's model or RNG state changes), and one
line naming the model and the shape that does not fit, instead of a traceback in round 1.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from ..errors import ConfigError

PROBE_SAMPLES = 2  # the fewest that BatchNorm accepts in train mode


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def probe_model(model: nn.Module, name: str, train_x: torch.Tensor, num_classes: int,
                single_sample_client: int | None = None, next_token: bool = False) -> None:
    """ConfigError unless `model` maps a batch of `train_x` to B x num_classes logits through
    features -> B x feature_dim -> head (a next-token model: B x L x ... throughout). `single_sample_client`:
    a client whose every batch holds one sample; then the model must also train (train mode) on one
    sample, which BatchNorm cannot. `next_token`: the data is a next-token task (data/tokens.py)."""
    per_token = getattr(model, "per_token", False)
    if per_token and not next_token:
        raise ConfigError(f"model.name={name} predicts a token at every position, but the data has one class a "
                          "sample; use a classification model")
    if next_token and not per_token:
        from ..models import TOKEN_MODELS

        raise ConfigError(f"model.name={name} predicts one class a sample, but the data is a next-token task (a "
                          f"target at every position); use model.name in [{', '.join(TOKEN_MODELS)}]")
    probe = copy.deepcopy(model).cpu()
    x = train_x[:PROBE_SAMPLES].detach().cpu()
    shape = tuple(x.shape)
    what = f"model.name={name} does not fit the data (inputs C x H x W = {tuple(shape[1:])}, {num_classes} classes)"
    probe.eval()
    with torch.no_grad():
        try:
            features = probe.features(x)
        except Exception as exc:
            raise ConfigError(f"{what}: its features fail on a batch of shape {shape}: {_first_line(exc)}") from None
        if not isinstance(features, torch.Tensor):
            raise ConfigError(f"{what}: its features return {type(features).__name__}, not one tensor; the features "
                              f"must map a batch to a tensor B x feature_dim (B x {probe.feature_dim})")
        # A next-token model (models/base.py TokenClassifier) keeps the positions: B x L x ... throughout.
        lead = tuple(x.shape[:2]) if getattr(probe, "per_token", False) else (len(x),)
        if tuple(features.shape) != lead + (probe.feature_dim,):
            raise ConfigError(f"{what}: its features map a batch of shape {shape} to shape {tuple(features.shape)}, "
                              f"but feature_dim is {probe.feature_dim} (the head takes B x {probe.feature_dim}); "
                              "make feature_dim the features' output width, or flatten the features to B x feature_dim")
        try:
            logits = probe(x)
        except Exception as exc:
            raise ConfigError(f"{what}: a batch of shape {shape} fails in its head: {_first_line(exc)}") from None
        if tuple(logits.shape) != lead + (num_classes,):
            raise ConfigError(f"{what}: a batch of shape {shape} gives logits of shape {tuple(logits.shape)}, "
                              f"expected {lead + (num_classes,)}")
    if single_sample_client is not None:
        probe.train()
        with torch.no_grad():
            try:
                probe(x[:1])
            except Exception as exc:
                raise ConfigError(
                    f"client {single_sample_client} holds a single training sample, and model.name={name} cannot "
                    f"train on a batch of one ({_first_line(exc)}); give that client more samples (partition) or "
                    "use a model without BatchNorm") from None

"""Freezing by name (model.freeze) and LoRA adapters (model.lora_*), applied to a built model.

A frozen parameter (requires_grad False) stays out of the flat vector that trains, is summed and is sent
(docs/extending.md, "Frozen parameters"), so both only have to mark parameters. LoRA adapters are injected
by PEFT (`peft.inject_adapter_in_model`), which replaces each targeted Linear / Conv2d in place and keeps
the model's own class, so a `Classifier` keeps its `features` and `head` (docs/foundation.md).
"""
from __future__ import annotations

from fnmatch import fnmatchcase

from torch import nn

from distfl.errors import ConfigError

LORA_LAYERS = (nn.Linear, nn.Conv2d)


def check_adapter_keys(v: dict) -> None:
    """One line for LoRA keys no run can use (before any work)."""
    if v["model.lora_dropout"] != 0:
        raise ConfigError(f"model.lora_dropout={v['model.lora_dropout']!r}: only 0 is supported (a dropout draw on "
                          "the adapters would not be keyed by client and round, so packs and ranks would differ)")
    if v["model.lora_rank"] > 0:
        try:
            import peft  # noqa: F401
        except ImportError:
            raise ConfigError("model.lora_rank > 0 injects the adapters with PEFT, which is not installed: "
                              "pip install 'distfl[lora]'") from None


def freeze(model: nn.Module, patterns: list[str]) -> None:
    """Freeze the parameters whose names match one of the fnmatch `patterns`; a pattern that matches none
    is refused in one line."""
    names = [name for name, _ in model.named_parameters()]
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name in names):
            raise ConfigError(f"model.freeze: {pattern!r} matches no parameter of the model; its parameters are "
                              f"{', '.join(names[:8])}{', ...' if len(names) > 8 else ''}")
    for name, p in model.named_parameters():
        if any(fnmatchcase(name, pattern) for pattern in patterns):
            p.requires_grad_(False)


def lora_targets(model: nn.Module, patterns: list[str]) -> list[str]:
    """The names of the Linear and Conv2d modules that `patterns` match (all of them for [])."""
    layers = [name for name, m in model.named_modules() if isinstance(m, LORA_LAYERS)]
    if not patterns:
        return layers
    for pattern in patterns:
        if not any(fnmatchcase(name, pattern) for name in layers):
            raise ConfigError(f"model.lora_targets: {pattern!r} matches none of the model's Linear and Conv2d "
                              f"layers: {', '.join(layers[:8])}{', ...' if len(layers) > 8 else ''}")
    return [name for name in layers if any(fnmatchcase(name, pattern) for pattern in patterns)]


def add_lora(model: nn.Module, rank: int, alpha: float, targets: list[str], aggregate: str) -> nn.Module:
    """Freeze every parameter of `model` and inject rank-`rank` adapters into the targeted layers (in place):
    A drawn from torch's generator (the run seeds it), B = 0, so the model computes what it computed before.
    aggregate=ffa freezes A too: only B trains (fedit and stack train both)."""
    from peft import LoraConfig, inject_adapter_in_model

    names = lora_targets(model, targets)
    model.requires_grad_(False)
    inject_adapter_in_model(LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=names, bias="none"),
                            model)
    for name, p in model.named_parameters():
        is_a, is_b = ".lora_A." in name, ".lora_B." in name
        p.requires_grad_(is_b or (is_a and aggregate != "ffa"))
    return model


def adapt(model: nn.Module, cfg) -> nn.Module:
    """`model` with model.freeze and model.lora_* applied (`cfg`: the model section)."""
    if cfg.freeze:
        freeze(model, cfg.freeze)
    if cfg.lora_rank > 0:
        add_lora(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, cfg.lora_aggregate)
    return model

"""The options a method or a feature declares as a dataclass `Options`: a method's under `algorithm.options`,
a feature's under `algorithm.feature_options.FEATURE_NAME`. Validation checks them here, before any data loads.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing

from distfl.config.values import choice_error, convert, float_error, in_range, range_error
from distfl.errors import ConfigError

# A feature's options: `algorithm.feature_options.FEATURE.KEY` (algorithms/feature.py, `check_features`).
FEATURE_OPTIONS_KEY = "algorithm.feature_options"


def declared_options(cls: type, fields: list, prefix: str, name: str, owner: str, kind: str, options: dict) -> dict:
    """`options` (given under the dotted key `prefix`) checked against `fields`, those of the `Options` dataclass
    of `cls`, a method or a feature (`kind`) called `name` (`owner`: how a line names it): complete (defaults
    filled in) and converted to the declared types, with ranges (`metadata={"range": "[0, 1)"}`) and choices
    (`metadata={"choices": [...]}`) checked like the other keys'."""
    names = [f.name for f in fields]
    for option in options:
        if option not in names:
            key = f"{prefix}.{option}"
            if not names:
                raise ConfigError(f"{key}: {owner} declares no options (a {kind} "
                                  "declares them as a dataclass `Options` on its class)")
            close = difflib.get_close_matches(str(option), names, n=1)
            hint = f"; did you mean '{prefix}.{close[0]}'?" if close else ";"
            raise ConfigError(f"unknown key {key!r}{hint} valid keys in {prefix!r} for {name}: {', '.join(names)}")
    types = typing.get_type_hints(cls.Options) if fields else {}
    out = {}
    for f in fields:
        key = f"{prefix}.{f.name}"
        if types[f.name] not in (bool, int, float, str):
            raise ConfigError(f"{name}: Options.{f.name} is declared as {types[f.name]!r}; {kind} options "
                              "must be bool, int, float or str")
        if f.name in options:
            value = convert(key, options[f.name], types[f.name])
            if types[f.name] is float and float_error(key, value):
                raise float_error(key, value)
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise ConfigError(f"{key} must be set: {name} gives it no default")
        if "choices" in f.metadata and value not in f.metadata["choices"]:
            raise choice_error(key, value, list(f.metadata["choices"]))
        if "range" in f.metadata and not _plugin_in_range(name, f.name, value, f.metadata["range"]):
            raise range_error(key, value, f.metadata["range"])
        out[f.name] = value
    return out


def _plugin_in_range(name: str, option: str, value, spec) -> bool:
    try:
        return in_range(value, spec)
    except (ValueError, TypeError):
        raise ConfigError(f"{name}: Options.{option} has metadata range {spec!r}; valid forms: \">= x\", "
                          "\"> x\", \"[0, 1)\", \"[0, 1]\", \"(0, 1]\", \"(0, 1)\"") from None

"""Methods and models from the user's own package: `package.module:Name` import paths and entry points.

`algorithm.name` and `model.name` take, besides the built-in names, an import path `package.module:Name`
or a short name that an installed package registers in the entry-point group `distfl.algorithms` or
`distfl.models`. Everything here runs during config validation, so a bad path fails before any work.
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect

from distfl.errors import ConfigError

GROUPS = {"algorithm.name": "distfl.algorithms", "model.name": "distfl.models",
          "aggregation.aggregator": "distfl.aggregators", "algorithm.features": "distfl.features"}


def is_import_path(name: str) -> bool:
    return ":" in name


def entry_point_names(key: str) -> list[str]:
    """Short names registered by installed packages for `key` (algorithm.name or model.name)."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=GROUPS[key])})


def load_object(key: str, name: str):
    """The object `name` (an import path or a registered short name) refers to, or ConfigError naming `key`."""
    if is_import_path(name):
        module_name, _, attr = name.partition(":")
        if not module_name or not attr:
            raise ConfigError(f"{key}={name!r}: an import path has the form package.module:Name")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ConfigError(f"{key}={name!r}: cannot import module {module_name!r} ({e}); is its package "
                              "installed or on PYTHONPATH?") from None
        obj = module
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise ConfigError(f"{key}={name!r}: module {module_name!r} has no attribute {attr!r}")
            obj = getattr(obj, part)
        return obj
    points = [ep for ep in importlib.metadata.entry_points(group=GROUPS[key]) if ep.name == name]
    if not points:
        raise KeyError(name)
    try:
        return points[0].load()
    except Exception as e:  # the registering package is broken: say which entry point
        raise ConfigError(f"{key}={name!r}: the entry point {points[0].value!r} (group {GROUPS[key]}) "
                          f"does not load: {e}") from None


def options_fields(cls) -> list[dataclasses.Field]:
    """The fields of a plugin's `Options` dataclass ([] for a method without one)."""
    options = getattr(cls, "Options", None)
    if options is None:
        return []
    if not (isinstance(options, type) and dataclasses.is_dataclass(options)):
        raise ConfigError(f"{cls.__module__}.{cls.__qualname__}.Options must be a dataclass, got {options!r}")
    return list(dataclasses.fields(options))


def load_plugin(key: str, name: str):
    """The algorithm class or model builder `name` refers to, checked; KeyError for an unknown short name."""
    obj = load_object(key, name)
    if key == "algorithm.name":
        from distfl.algorithms.base import Algorithm

        if not (isinstance(obj, type) and issubclass(obj, Algorithm)):
            raise ConfigError(f"algorithm.name={name!r} is {obj!r}, not a subclass of distfl.Algorithm; a "
                              "method is a class `class MyMethod(distfl.Algorithm)` (docs/extending.md)")
        if obj.init_client_state is not Algorithm.init_client_state and not obj.stateful:
            raise ConfigError(f"algorithm.name={name}: {obj.__name__} defines init_client_state but not `stateful = "
                              "True`, so distfl keeps no client state for it (run.state stays empty, and is never "
                              f"stored between rounds): add `stateful = True` to class {obj.__name__}")
        options_fields(obj)
    elif key == "aggregation.aggregator":
        from distfl.federation.aggregate import Aggregator

        if not (isinstance(obj, type) and issubclass(obj, Aggregator)):
            raise ConfigError(f"aggregation.aggregator={name!r} is {obj!r}, not a subclass of "
                              "distfl.federation.aggregate.Aggregator (docs/extending.md, An aggregator)")
    elif key == "algorithm.features":
        pass  # algorithms/feature.py checks that it is a Feature
    elif not callable(obj) or not _takes_shape_and_classes(obj):
        raise ConfigError(f"model.name={name!r} is {obj!r}, not a model class or factory: a function or nn.Module "
                          "class called as build(input_shape, num_classes) that returns an nn.Module (docs/extending.md)")
    return obj


def _takes_shape_and_classes(builder) -> bool:
    """Whether `builder(input_shape, num_classes)` binds to its signature (True when it has none to read)."""
    try:
        inspect.signature(builder).bind((1, 1, 1), 2)
    except TypeError:
        return False
    except ValueError:  # a builtin without a signature: its own error comes when it is called
        return True
    return True

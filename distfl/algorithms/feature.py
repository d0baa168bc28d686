"""A feature: a cross-cutting change to every round, around any method (FedBN, GMA, compression, DP).

A feature is one class in its own file (a built-in one in this package, found by its `name` alone; your
own by import path in `algorithm.features`, docs/extending.md). It declares:
  - `feature_name` (not `name`: what a feature does not define is the method's, its `name` included),
    and `keys`: the config keys it reads (they stay in the run's config; users' spellings);
  - `Options`: a dataclass of its own options, set as algorithm.feature_options.<feature_name>.KEY and
    read as `self.options` (checked, defaults filled in, at validation: `check_features`);
  - `enabled(cfg)`: whether the run has it on (a feature listed in algorithm.features always is);
  - `refuse(v, method)`: what it refuses to combine with, one ConfigError line each, at validation;
  - `order`: its place around the method: a feature with a larger order wraps the ones with smaller
    orders (ties: by name), so it sees what they send and they see what it hands back;
  - how it wraps the method: `added_segments()` (statistics it adds to the round's sum),
    `encoded_bytes(segment)` (what it makes a segment cost on the wire), `contribution(...)` (each
    client's contribution to a segment, before it is added), `add_statistics(...)` (its own
    contributions), `transform_reduced(...)` (the round's reduced sums, before the method's server step),
    `kept_params` (the parameter coordinates it keeps on the clients, which the server step does not set);
    and any method hook it needs to change (algorithms/base.py's names and signatures);
  - its state, checkpointed with the method's: `state_dict()` and `load_state_dict(state)`.
`build_algorithm` wraps the method in the enabled features in their declared order; the runtime only ever
talks to the outermost one (wrapper.py).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import ConfigError
from ..federation.aggregate import Segment
from .wrapper import Wrapper


@dataclass
class FeatureSetting:
    """What a feature may build itself from, besides the config: the rank's model and device, the run's
    noise multiplier (DP), its distributed context, and the classes of the run's enabled features."""
    worker: object
    device: torch.device
    noise_multiplier: float | None = None
    ctx: object = None
    features: tuple = ()


class Feature(Wrapper):
    feature_name = "feature"
    keys: tuple[str, ...] = ()  # the config keys it reads (docs/config.md documents them)
    Options = None  # a dataclass of its options (algorithm.feature_options.<feature_name>), read as `self.options`
    order = 50  # larger: further out (built-in: GMA 10, FedBN 20, compression 30, DP 40)
    private = False  # True: the round releases only noised sums (features inside it report no per-client figures)
    kept_params: torch.Tensor | None = None  # bool mask of the parameters the clients keep (FedBN's BatchNorm)

    @classmethod
    def enabled(cls, cfg) -> bool:
        """Whether `cfg` turns this feature on; a feature named in algorithm.features is on."""
        return True

    @classmethod
    def refuse(cls, v: dict, method: type) -> None:
        """Raise ConfigError (one line: the keys, why, what is valid) for a run this feature cannot serve.
        `v`: dotted key -> checked value; `method`: the class of the trained method (its declarations)."""

    @classmethod
    def read_options(cls, cfg):
        """Its options in `cfg` (algorithm.feature_options.<feature_name>) as an instance of `Options`, or None."""
        return cls.Options(**cfg.algorithm.feature_options.get(cls.feature_name, {})) if cls.Options else None

    def __init__(self, inner, cfg, setting: FeatureSetting):
        super().__init__(inner)
        if self.Options is not None:  # else `options` stays the method's (algorithm.options), read through
            self._own(options=self.read_options(cfg))

    def overrides(self, hook: str) -> bool:
        """Whether `hook` does something: this feature's class (or a base of it) defines it, or a declared
        transform acts through it (`contribution` through client_statistics: a pack then adds its clients'
        statistics one by one), or the method inside does."""
        defined = any(hook in vars(cls) for cls in type(self).__mro__ if cls not in (Feature, Wrapper, object))
        return defined or any(_defines(self, declared) for declared in _ACTS_THROUGH.get(hook, ())) or \
            self.inner.overrides(hook)

    # ---- what travels ------------------------------------------------------------------------------
    def added_segments(self) -> list[Segment]:
        """The statistics this feature adds to the round's sum (its `add_statistics` adds to them)."""
        return []

    def encoded_bytes(self, segment: Segment) -> int | None:
        """One client's encoded size of `segment` in bytes, where this feature encodes it; None: as it was."""
        return None

    def segments(self) -> list[Segment]:
        out = []
        for segment in self.inner.segments():
            encoded = self.encoded_bytes(segment)
            out.append(segment if encoded is None else replace(segment, encoded_bytes=encoded))
        return out + self.added_segments()

    # ---- client side -------------------------------------------------------------------------------
    def contribution(self, name: str, value, weight: float, run) -> tuple:
        """(value, weight) a client adds to segment `name` instead of what the method inside gave."""
        return value, weight

    def add_statistics(self, run, worker, stats) -> None:
        """Add this feature's own contributions (its `added_segments`) after the method's."""

    def client_statistics(self, run, worker, stats) -> None:
        inner_stats = _Contributions(self, run, stats) if _defines(self, "contribution") else stats
        self.inner.client_statistics(run, worker, inner_stats)
        self.add_statistics(run, worker, stats)

    # ---- server side -------------------------------------------------------------------------------
    def transform_reduced(self, reduced):
        """The round's reduced sums as the method's server step reads them (default: as they are)."""
        return reduced

    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        self.inner.server_update(params, buffers, self.transform_reduced(reduced))

    # ---- state -------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """What this feature keeps between rounds on the server (checkpointed); {}: nothing."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def server_state(self) -> dict:
        state = self.inner.server_state()
        own = self.state_dict()
        return {**state, f"feature:{self.feature_name}": own} if own else state

    def load_server_state(self, state: dict) -> None:
        key = f"feature:{self.feature_name}"
        self.inner.load_server_state({k: v for k, v in state.items() if k != key})
        if key in state:
            self.load_state_dict(state[key])


# The method hooks through which a feature's declared transforms act.
_ACTS_THROUGH = {"client_statistics": ("contribution", "add_statistics"), "server_update": ("transform_reduced",),
                 "segments": ("added_segments", "encoded_bytes")}


def _defines(feature: Feature, hook: str) -> bool:
    return getattr(type(feature), hook) is not getattr(Feature, hook)


class _Contributions:
    """The round's aggregator as the method inside a feature adds to it: each add passes through the
    feature's `contribution`."""

    def __init__(self, feature: Feature, run, stats):
        self._feature, self._run, self._stats = feature, run, stats

    def add(self, name: str, value, weight: float = 1.0) -> None:
        value, weight = self._feature.contribution(name, value, weight, self._run)
        self._stats.add(name, value, weight)

    def __getattr__(self, name: str):
        return getattr(self._stats, name)


def kept_params(method) -> torch.Tensor | None:
    """The parameter coordinates the run's features keep on the clients (`Feature.kept_params`, OR-ed), or
    None: the server step sets them all. A method reads it from `self.outer`, once it is wrapped."""
    kept = None
    while isinstance(method, Wrapper):
        if isinstance(method, Feature) and method.kept_params is not None:
            kept = method.kept_params if kept is None else kept | method.kept_params
        method = method.inner
    return kept


# ---- the registry ------------------------------------------------------------------------------------
def run_features(cfg) -> list[type]:
    """The classes of the run's enabled features, innermost first: the built-in ones its keys turn on and
    those algorithm.features names (import paths or entry points), sorted by (order, name)."""
    from . import FEATURES

    found = [cls for cls in FEATURES.values() if cls.enabled(cfg)]
    found += [plugin_feature(name) for name in cfg.algorithm.features]
    return sorted(found, key=lambda cls: (cls.order, cls.feature_name))


def plugin_feature(name: str) -> type:
    """The Feature class `name` (an import path or an entry point's name) refers to; ConfigError if none."""
    from ..plugins import entry_point_names, load_plugin

    try:
        cls = load_plugin("algorithm.features", name)
    except KeyError:
        known = entry_point_names("algorithm.features")
        raise ConfigError(f"algorithm.features: no feature {name!r}; name one by import path package.module:ClassName "
                          f"(a distfl.Feature subclass){', or one of ' + ', '.join(known) if known else ''}") from None
    if not (isinstance(cls, type) and issubclass(cls, Feature)):
        raise ConfigError(f"algorithm.features: {name!r} is {cls!r}, not a subclass of distfl.Feature "
                          "(docs/extending.md, Write a feature)")
    return cls


def check_features(cfg, v: dict, method: type) -> None:
    """Each enabled feature's options (`cfg.algorithm.feature_options`, complete) and its refusals (config
    validation, before any data loads)."""
    classes = run_features(cfg)
    names = [cls.feature_name for cls in classes]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"algorithm.features: two features are named {name!r}; list each feature once")
    cfg.algorithm.feature_options = _feature_options(classes, cfg.algorithm.feature_options)
    for cls in classes:
        cls.refuse(v, method)


def _feature_options(classes: list[type], given: dict) -> dict:
    """algorithm.feature_options checked against the enabled features' `Options`: feature name -> its options,
    complete, for each enabled feature that declares Options."""
    from ..config.options import FEATURE_OPTIONS_KEY, declared_options
    from ..config.values import shown
    from ..plugins import options_fields

    by_name = {cls.feature_name: cls for cls in classes}
    for name, options in given.items():
        if name not in by_name:
            declaring = [n for n, cls in by_name.items() if cls.Options is not None]
            valid = f"the run's features with options: {', '.join(declaring)}" if declaring else \
                "none of the run's features declares options"
            raise ConfigError(f"{FEATURE_OPTIONS_KEY}.{name}: no enabled feature is named {name!r} ({valid}; "
                              "a feature's options apply only while it is on: list it in algorithm.features)")
        if not isinstance(options, dict):
            raise ConfigError(f"{FEATURE_OPTIONS_KEY}.{name} must be a mapping of {name}'s options (KEY: VALUE), "
                              f"got {shown(options)} ({type(options).__name__})")
    resolved = {name: declared_options(cls, options_fields(cls), f"{FEATURE_OPTIONS_KEY}.{name}", name,
                                       f"the feature {name}", "feature", given.get(name, {}))
                for name, cls in by_name.items()}
    return {name: options for name, options in resolved.items() if by_name[name].Options is not None}


def wrap_in_features(method, cfg, setting: FeatureSetting):
    """`method` wrapped in the run's enabled features, in their declared order (innermost first)."""
    classes = run_features(cfg)
    setting = replace(setting, features=tuple(classes))
    for cls in classes:
        method = cls(method, cfg, setting)
    return method

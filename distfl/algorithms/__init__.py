"""One file per method; `algorithm_class` picks by `algorithm.name`: a built-in name, an import path
`package.module:ClassName`, or a name registered in the entry-point group `distfl.algorithms`.

A built-in method is a `distfl.Algorithm` subclass with its own `name` in a module of this package,
found here by that alone: adding one touches its file (and its docs), as a plugin would. A built-in
feature (feature.py: FedBN, GMA, compression, DP) is a `distfl.Feature` subclass found the same way, by
its `feature_name`."""
import importlib
import pkgutil

from .base import Algorithm
from .feature import Feature


def _built_in(base: type, name: str) -> dict[str, type]:
    """`name` -> class of every `base` subclass that declares its own `name` in a module of this package,
    in name order."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        for obj in vars(loaded).values():
            if (isinstance(obj, type) and issubclass(obj, base) and obj is not base and obj.__module__ == loaded.__name__
                    and name in vars(obj)):
                found[getattr(obj, name)] = obj
    return dict(sorted(found.items()))


ALGORITHMS = _built_in(Algorithm, "name")
FEATURES = _built_in(Feature, "feature_name")


def algorithm_class(name: str) -> type:
    """The class that declares a built-in or plugin method (config validation has checked `name`)."""
    from ..plugins import load_plugin

    return ALGORITHMS[name] if name in ALGORITHMS else load_plugin("algorithm.name", name)


def method_class(cfg) -> type:
    """The class whose rounds train the run's model (TCT: its stage-1 method); its Options are
    `algorithm.options`."""
    return algorithm_class(cfg.algorithm.name).trained_method(cfg)


def build_algorithm(cfg, population, worker, device, model_factory=None, noise_multiplier: float | None = None,
                    ctx=None):
    """The training algorithm (for TCT, its stage-1 algorithm: its later stages are phases), wrapped in
    the run's enabled features in their declared order (feature.py; `noise_multiplier`: DP's)."""
    from .base import check_built_model
    from .feature import FeatureSetting, wrap_in_features

    cls = method_class(cfg)
    check_built_model(cls, cfg, worker)
    method = cls(cfg, population, worker, device, model_factory)
    return wrap_in_features(method, cfg, FeatureSetting(worker, device, noise_multiplier, ctx))


def build_phases(cfg) -> list:
    """The run's phases after its training rounds, in order (federation/phases.py): the method's own
    (TCT's stages), then the calibration (SphereFed's FFC or CCVR). Imported only when a run has them."""
    phases = algorithm_class(cfg.algorithm.name).phases(cfg)
    if cfg.calibration.method == "ffc":
        from .ffc import FFCPhase

        phases.append(FFCPhase())
    elif cfg.calibration.method == "ccvr":
        from .ccvr import CCVRPhase

        phases.append(CCVRPhase())
    return phases

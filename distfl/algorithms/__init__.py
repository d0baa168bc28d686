"""One file per method; `algorithm_class` picks by `algorithm.name`: a built-in name, an import path
`package.module:ClassName`, or a name registered in the entry-point group `distfl.algorithms`.

A built-in method is a `distfl.Algorithm` subclass with its own `name` in a module of this package,
found here by that alone: adding one touches its file (and its docs), as a plugin would."""
import importlib
import pkgutil

from .base import Algorithm


def _built_in() -> dict[str, type]:
    """name -> class of every method defined in a module of this package, in name order."""
    found = {}
    for module in pkgutil.iter_modules(__path__):
        loaded = importlib.import_module(f"{__name__}.{module.name}")
        for obj in vars(loaded).values():
            if (isinstance(obj, type) and issubclass(obj, Algorithm) and obj is not Algorithm and obj.__module__ == loaded.__name__
                    and "name" in vars(obj)):
                found[obj.name] = obj
    return dict(sorted(found.items()))


ALGORITHMS = _built_in()


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
    the run's cross-cutting features: GMA, FedBN, compression, then DP outermost (with `noise_multiplier`:
    what DP clips and noises is the decoded compressed update)."""
    from .base import check_built_model
    from .fedbn import FedBN
    from .gma import GMA
    from .private import Private

    cls = method_class(cfg)
    check_built_model(cls, cfg, worker)
    method = cls(cfg, population, worker, device, model_factory)
    if cfg.model.lora_rank and cfg.model.lora_aggregate == "stack":  # FLoRA: the sum of the products, merged
        from .lora_stack import LoraStack

        method = LoraStack(method, cfg, worker)
    if cfg.aggregation.mask == "gma":
        method = GMA(method, cfg.aggregation.tau, cfg.aggregation.mask_applies_to)
    if cfg.aggregation.fedbn:
        method = FedBN(method, worker, cfg.model.name)
    if cfg.compression.up != "none":
        from .compressed import Compressed

        method = Compressed(method, cfg, worker, report_error=cfg.privacy.mechanism == "none")
    if cfg.privacy.mechanism not in ("none", "ddgauss", "skellam"):  # distributed DP: secagg/aggregator.py
        from ..privacy.mechanism import GaussianMechanism

        method = Private(method, GaussianMechanism(cfg, method.segments(), noise_multiplier, device, ctx))
    return method


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

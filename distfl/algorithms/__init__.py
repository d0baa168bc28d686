"""One file per method; `build_algorithm` picks by `algorithm.name`: a built-in name, an import path
`package.module:ClassName`, or a name registered in the entry-point group `distfl.algorithms`."""
from .apfl import APFL
from .ditto import Ditto
from .fedadc import FedADC
from .fedavg import FedAvg
from .fedbn import FedBN
from .fedbabu import FedBABU
from .fedexp import FedExP
from .feddyn import FedDyn
from .fedfor import FedFOR
from .fednova import FedNova
from .fedper import FedPer
from .fedprox import FedProx
from .fedrep import FedRep
from .gma import GMA
from .moon import Moon
from .private import Private
from .scaffold import Scaffold
from .slowmo import SlowMo

ALGORITHMS = {cls.name: cls for cls in (FedAvg, FedProx, Scaffold, FedDyn, FedNova, FedFOR, FedADC, SlowMo,
                                        Moon, FedExP)}
# Personalised methods (scored by eval.clients), registered through the same hooks a plugin uses.
ALGORITHMS.update({cls.name: cls for cls in (FedPer, FedRep, FedBABU, Ditto, APFL)})


def algorithm_class(name: str) -> type:
    """The class of a built-in or plugin method (config validation has checked `name`)."""
    from ..plugins import load_plugin

    return ALGORITHMS[name] if name in ALGORITHMS else load_plugin("algorithm.name", name)


def build_algorithm(cfg, population, worker, device, model_factory=None, noise_multiplier: float | None = None,
                    ctx=None):
    """The training algorithm (for TCT, its stage-1 algorithm: its later stages are phases), wrapped in
    the run's cross-cutting features: GMA, FedBN, then DP outermost (with `noise_multiplier`)."""
    name = cfg.tct.stage1 if cfg.algorithm.name == "tct" else cfg.algorithm.name
    method = algorithm_class(name)(cfg, population, worker, device, model_factory)
    if cfg.aggregation.mask == "gma":
        method = GMA(method, cfg.aggregation.tau, cfg.aggregation.mask_applies_to)
    if cfg.aggregation.fedbn:
        method = FedBN(method, worker, cfg.model.name)
    if cfg.privacy.mechanism != "none":
        from ..privacy.mechanism import GaussianMechanism

        method = Private(method, GaussianMechanism(cfg, method.segments(), noise_multiplier, device, ctx))
    return method


def build_phases(cfg) -> list:
    """The run's phases after its training rounds, in order (federation/phases.py): TCT's stages, then
    SphereFed's FFC calibration. Imported only when a run has them (they pull in their solvers)."""
    phases = []
    if cfg.algorithm.name == "tct":
        from .tct import TCTPhase

        phases.append(TCTPhase())
    if cfg.calibration.method == "ffc":
        from .ffc import FFCPhase

        phases.append(FFCPhase())
    return phases

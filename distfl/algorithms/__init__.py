"""One file per method; `build_algorithm` picks by `algorithm.name`."""
from .fedadc import FedADC
from .fedavg import FedAvg
from .feddyn import FedDyn
from .fedfor import FedFOR
from .fednova import FedNova
from .fedprox import FedProx
from .scaffold import Scaffold
from .slowmo import SlowMo

ALGORITHMS = {cls.name: cls for cls in (FedAvg, FedProx, Scaffold, FedDyn, FedNova, FedFOR, FedADC, SlowMo)}


def build_algorithm(cfg, population, worker, device, model_factory=None):
    """The training algorithm; for TCT, its stage-1 algorithm (its later stages are phases)."""
    name = cfg.tct.stage1 if cfg.algorithm.name == "tct" else cfg.algorithm.name
    return ALGORITHMS[name](cfg, population, worker, device, model_factory)

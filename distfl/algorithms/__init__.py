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
    return ALGORITHMS[cfg.algorithm.name](cfg, population, worker, device, model_factory)

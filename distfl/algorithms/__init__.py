"""One file per method; `build_algorithm` picks by `algorithm.name`."""
from .fedavg import FedAvg
from .feddyn import FedDyn
from .fednova import FedNova
from .fedprox import FedProx
from .scaffold import Scaffold

ALGORITHMS = {cls.name: cls for cls in (FedAvg, FedProx, Scaffold, FedDyn, FedNova)}


def build_algorithm(cfg, population, worker, device, model_factory=None):
    return ALGORITHMS[cfg.algorithm.name](cfg, population, worker, device, model_factory)

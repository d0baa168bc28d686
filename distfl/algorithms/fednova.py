"""FedNova (Wang et al. 2020): normalised averaging, so clients that take more local steps do not
pull the global model further.

Client i takes tau_i local steps; with local momentum rho its normaliser is
  a_i = (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho)      (a_i = tau_i without momentum)
Server:  w <- w + tau_eff * sum_i p_i (w_i - w) / a_i,   tau_eff = sum_i p_i a_i
(then the server optimizer, sgd lr 1 = the paper). With equal tau_i this is FedAvg.
"""
from ..federation.aggregate import Segment
from .base import Algorithm


def normaliser(steps: int, rho: float) -> float:
    if rho == 0:
        return float(steps)
    return (steps - rho * (1 - rho**steps) / (1 - rho)) / (1 - rho)


class FedNova(Algorithm):
    name = "fednova"
    tct_stage1 = True
    why_not_private = "FedNova releases each client's normalised step count (tau_eff) unclipped and weights the update by it"

    def segments(self):
        # a_i reaches ~tau_i / (1 - rho): thousands of steps; a unit of 2^-30 leaves room for 2^23.
        return super().segments() + [Segment("tau_eff", 1, frac_bits=30)]

    def client_statistics(self, run, worker, stats):
        a = normaliser(run.steps, self.cfg.train.momentum)
        self.add_update(stats, worker.params - run.global_params, run.weight / a)
        stats.add("buffers", worker.buffers, run.weight)
        stats.add("tau_eff", a, run.weight)

    def server_direction(self, params, reduced):
        return (reduced["delta"] * reduced.scalar("tau_eff")).to(params.dtype)

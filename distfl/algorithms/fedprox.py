"""FedProx (Li et al. 2020): local loss + mu/2 ||w - w_global||^2, i.e. gradient + mu (w - w_global)."""
from .base import Algorithm


class FedProx(Algorithm):
    name = "fedprox"

    def correct_gradient(self, w, g, run):
        g.add_(w - run.global_params, alpha=self.cfg.algorithm.mu)

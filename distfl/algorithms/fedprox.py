"""FedProx (Li et al. 2020): local loss + mu/2 ||w - w_global||^2, i.e. gradient + mu (w - w_global)."""
from dataclasses import dataclass, field

from .base import Algorithm


class FedProx(Algorithm):
    name = "fedprox"
    tct_stage1 = True
    private_release = True
    asynchronous = True

    @dataclass
    class Options:
        mu: float = field(default=0.01, metadata={"range": ">= 0"})  # proximal weight, loss + mu/2 ||w - w_global||^2

    def correct_gradient(self, w, g, run):
        g.add_(w - run.global_params, alpha=self.options.mu)

"""FedLC: federated learning via logits calibration (Zhang, Li, Li, Xu, Wu, Ding, Wu, "Federated Learning
with Label Distribution Skew via Logits Calibration", ICML 2022); docs/algorithms/fedlc.md.

Client k calibrates its logits before the softmax cross-entropy by a pairwise label margin that grows
as a class gets rarer in its own training data: with n_{k,c} its samples of class c,
    L_cal(x, y) = -log( exp(f_y(x) - tau n_{k,y}^{-1/4}) / sum_c exp(f_c(x) - tau n_{k,c}^{-1/4}) ),
i.e. cross-entropy of the calibrated logits f(x) - tau n_k^{-1/4}. A class the client lacks has its
count clamped to 1e-8 (its logit is lowered by 100 tau), as the public implementations do. The local
optimizer and the server are FedAvg's; at tau = 0 the method is FedAvg, bit for bit. The client releases
only its model update (the counts stay on the client).
"""
from dataclasses import dataclass, field

import torch

from .base import Algorithm


class FedLC(Algorithm):
    name = "fedlc"
    private_release = True
    cross_entropy = "calibrates the logits of a softmax cross-entropy"

    @dataclass
    class Options:
        tau: float = field(default=1.0, metadata={"range": ">= 0"})  # the calibration strength tau of the margin tau n^{-1/4} (FL-bench's default 1.0; 0: FedAvg)

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        counts = torch.as_tensor(population.class_counts, dtype=torch.float32).clamp_min(1e-8)
        # margins[k, c] = tau n_{k,c}^{-1/4}, one row per client
        self.margins = (self.options.tau * counts.pow(-0.25)).to(device)

    def local_loss(self, model, x, y, run):
        return model.loss(model(x) - self.margins[run.client_id], y)

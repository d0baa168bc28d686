"""FedNTD: not-true distillation (Lee, Jeong, Shin, Yun, "Preservation of the Global Knowledge by
Not-True Distillation in Federated Learning", NeurIPS 2022); docs/algorithms/fedntd.md.

Client k trains from the global model w^t on its own data with
    L = CE(f_w(x), y) + beta * L_NTD,
    L_NTD = KL( q~_g || q~_l ) averaged over the batch,
where q~ are softmax distributions at temperature tau over the NOT-TRUE classes only (the true class y
removed from the logits before the softmax): q~_l from the model being trained, q~_g from the frozen
global model w^t the client received. The global model's knowledge of the classes a client does not
see is kept; its true-class prediction is left to the cross-entropy. No tau^2 factor (as the authors'
code). The server is FedAvg's; at beta = 0 the method is FedAvg, bit for bit. The client releases only
its model update.
"""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..federation.local import FlatModel
from .base import Algorithm


def not_true_logits(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The logits without each row's true class, in class order: shape (batch, classes - 1)."""
    keep = torch.arange(logits.shape[1], device=logits.device) != y.unsqueeze(1)
    return logits[keep].view(len(y), logits.shape[1] - 1)


def ntd_loss(logits: torch.Tensor, global_logits: torch.Tensor, y: torch.Tensor, tau: float) -> torch.Tensor:
    """KL(q~_g || q~_l) over the not-true classes at temperature tau, averaged over the batch."""
    local = F.log_softmax(not_true_logits(logits, y) / tau, dim=1)
    target = F.softmax(not_true_logits(global_logits, y) / tau, dim=1)
    return F.kl_div(local, target, reduction="batchmean")


class FedNTD(Algorithm):
    name = "fedntd"
    private_release = True
    cross_entropy = "adds a distillation term to a softmax cross-entropy"

    @dataclass
    class Options:
        beta: float = field(default=1.0, metadata={"range": ">= 0"})  # weight of the not-true distillation term (the authors' config: 1; 0: FedAvg)
        tau: float = field(default=1.0, metadata={"range": "> 0"})  # softmax temperature of both not-true distributions (the authors' config: 1)

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        # The frozen global model w^t, in eval mode (BatchNorm uses its running statistics), built
        # without touching the RNG stream that seeded the worker.
        with torch.random.fork_rng(devices=[]):
            self.global_model = FlatModel(self.model_factory())
        self.global_model.copy_frozen(worker)  # a frozen backbone: the worker's weights, not a fresh draw
        for p in self.global_model.module.parameters():
            p.requires_grad_(False)
        self.global_model.module.eval()

    def begin_client(self, run, worker):
        super().begin_client(run, worker)
        self.global_model.load(run.global_params, worker.buffers)

    def local_loss(self, model, x, y, run):
        logits = model(x)
        with torch.no_grad():
            global_logits = self.global_model.module(x)
        return model.loss(logits, y) + self.options.beta * ntd_loss(logits, global_logits, y, self.options.tau)

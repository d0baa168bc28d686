"""FedProto (Tan, Long, Liu, Zhou, Lu, Jiang, Zhang, "FedProto: Federated Prototype Learning across
Heterogeneous Clients", AAAI 2022), Algorithm 1; docs/algorithms/fedproto.md maps it to this file.

Clients exchange class prototypes instead of weights. Each client keeps its whole model (as local-only
training, `LocalOnly`: v_k from w^0 in the client-state store). Round t, client k, each local step on (x, y)
with features z = represent(x):
    L = CE(head(z), y) + lambda * MSE(z, P^t[y])     (MSE over the batch and the feature dimensions;
                                                     a sample whose class has no global prototype: 0)
and its local prototypes C_k[c] = the mean of the features z of its class-c samples over the batches of
the round's last local epoch (as the authors' code collects them, from the model as it trains, afresh each
epoch; with train.local_steps: the last pass's worth of batches, all of them when there are fewer). Server: the global prototype
of class c is the unweighted mean of the cohort's C_k[c] over the clients that hold class c; P^{t+1} has
the classes the round's cohort held (the others have none, as in the authors' code). No weights are
aggregated: the global model stays w^0. eval.clients scores each client's own model.
"""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..federation.aggregate import Segment
from ..federation.local import local_steps
from .local import LocalOnly


class FedProto(LocalOnly):
    name = "fedproto"

    @dataclass
    class Options:
        lam: float = field(default=1.0, metadata={"range": ">= 0"})  # weight of the prototype regulariser (the authors' code: ld = 1)

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.num_classes = int(population.class_counts.shape[1])
        self.dim = int(worker.module.feature_dim)
        self.protos = torch.zeros(self.num_classes, self.dim, device=device)  # P^t
        self.present = torch.zeros(self.num_classes, dtype=torch.bool, device=device)
        self._sum = self._count = None  # the client training now: feature sums and counts per class
        self._batch = self._first_kept = 0  # the client training now: its batch count, the first batch its prototypes read

    def begin_client(self, run, worker):
        super().begin_client(run, worker)
        self._sum = torch.zeros(self.num_classes, self.dim, device=self.device)
        self._count = torch.zeros(self.num_classes, device=self.device)
        one_epoch = local_steps(run.num_samples, self.cfg.train.batch_size, 1, fold_single=worker.fold_single)
        self._batch, self._first_kept = 0, max(0, run.steps - one_epoch)  # the last epoch's batches

    def local_loss(self, model, x, y, run):
        z = model.represent(x)
        loss = model.loss(model.head(z), y)
        if self._batch >= self._first_kept:
            with torch.no_grad():
                self._sum.index_add_(0, y, z.detach().float())
                self._count += torch.bincount(y, minlength=self.num_classes).float()
        self._batch += 1
        if not bool(self.present.any()):
            return loss
        target = torch.where(self.present[y].unsqueeze(1), self.protos[y], z.detach())
        return loss + self.options.lam * F.mse_loss(z, target)

    def segments(self):
        return [Segment("proto_sum", self.num_classes * self.dim),
                Segment("proto_clients", self.num_classes, kind="int")]

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        held = self._count > 0
        means = torch.where(held.unsqueeze(1), self._sum / self._count.clamp_min(1).unsqueeze(1), 0.0)
        stats.add("proto_sum", means.reshape(-1))
        stats.add("proto_clients", held.long())

    def server_update(self, params, buffers, reduced):
        clients = reduced["proto_clients"].to(self.device)
        sums = reduced["proto_sum"].to(self.device, torch.float32).view(self.num_classes, self.dim)
        self.present = clients > 0
        self.protos = torch.where(self.present.unsqueeze(1), sums / clients.clamp_min(1).unsqueeze(1), 0.0)

    def server_state(self):
        return {**super().server_state(), "protos": self.protos.clone(), "present": self.present.clone()}

    def load_server_state(self, state):
        super().load_server_state(state)
        self.protos = state["protos"].to(self.device)
        self.present = state["present"].to(self.device)

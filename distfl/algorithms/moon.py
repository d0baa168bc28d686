"""MOON: model-contrastive federated learning (Li, He, Song, CVPR 2021), Algorithm 1, Eq. 2-3.

Client i in round t trains w (from the global model w^t) on its own data, with two frozen models beside
it: the global model w^t it received and its own local model w_i^{t-1} from the last round it trained.
For a mini-batch x (R_w: the network up to the projection head's output, `model.represent`):

    z = R_w(x),  z_glob = R_{w^t}(x),  z_prev = R_{w_i^{t-1}}(x)
    l_con = -log( exp(sim(z, z_glob)/tau) / (exp(sim(z, z_glob)/tau) + exp(sim(z, z_prev)/tau)) )    (Eq. 2)
    loss  = l_sup(head(z), y) + mu * l_con                                                          (Eq. 3)

sim is the cosine similarity; l_con is averaged over the batch like l_sup. The server is FedAvg's (the
weighted mean of the client models, through the server optimizer). The client's local model after
training is its `previous_params` / `previous_buffers` in the client-state store for its next round; a
client sampled for the first time has none, and trains on l_sup alone (what the released code does in
round 1, where its pool of previous models is empty). docs/algorithms/moon.md.
"""
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import ConfigError
from ..federation.local import FlatModel
from .base import Algorithm


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 2, averaged over the batch: cross-entropy of the logits [sim(z, z_glob), sim(z, z_prev)] / tau
    with the global model's representation as the positive (class 0)."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1) / tau
    return F.cross_entropy(logits, torch.zeros(len(z), dtype=torch.long, device=z.device))


class Moon(Algorithm):
    name = "moon"
    stateful = True  # each client's previous local model

    @dataclass
    class Options:
        mu: float = field(default=1.0, metadata={"range": ">= 0"})  # weight mu of the model-contrastive loss, loss + mu * l_con (the released code's default; the paper's tuned values: 5 for CIFAR-10, 1 for CIFAR-100 and Tiny-ImageNet)
        tau: float = field(default=0.5, metadata={"range": "> 0"})  # temperature tau of l_con (paper: 0.5)

    @classmethod
    def check_config(cls, cfg):
        if cfg.model.projection_dim <= 0:
            raise ConfigError(
                "algorithm.name=moon computes its contrastive loss on a projection head's output (the paper: a "
                "2-layer MLP with 256 outputs); set model.projection_dim=256, and the same on the runs you "
                "compare it with")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.mu = float(self.options.mu)
        self.tau = float(self.options.tau)
        # Two frozen copies of the network, in eval mode (BatchNorm uses its running statistics, as the
        # released code's .eval() copies do), built without touching the RNG stream that seeded the worker.
        with torch.random.fork_rng(devices=[]):
            self.global_model = FlatModel(self.model_factory())
            self.previous_model = FlatModel(self.model_factory())
        for copy in (self.global_model, self.previous_model):
            copy.copy_frozen(self.layout)  # a frozen backbone: the worker's weights, not a fresh draw
            for p in copy.module.parameters():
                p.requires_grad_(False)
            copy.module.eval()

    def begin_client(self, run, worker):
        super().begin_client(run, worker)
        # The worker holds the model this client received (under FedBN with its own BatchNorm).
        self.global_model.load(run.global_params, worker.buffers)
        if "previous_params" in run.state:
            self.previous_model.load(run.state["previous_params"], run.state["previous_buffers"])
            self.outer.load_own_model(run.state, self.previous_model)  # FedBN: its BatchNorm is the client's own

    def local_loss(self, model, x, y, run):
        z = model.represent(x)
        supervised = model.loss(model.head(z), y)
        if "previous_params" not in run.state:
            return supervised
        with torch.no_grad():
            z_glob = self.global_model.module.represent(x)
            z_prev = self.previous_model.module.represent(x)
        return supervised + self.mu * contrastive_loss(z, z_glob, z_prev, self.tau)

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        run.state["previous_params"] = worker.params.clone()
        run.state["previous_buffers"] = worker.buffers.clone()

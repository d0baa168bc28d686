"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, "Think Locally, Act
Globally: Federated Learning with Local and Global Representations", 2020), Algorithm 1;
docs/algorithms/lgfedavg.md maps it to this file.

Each client keeps its own LOCAL layers and the server averages only the GLOBAL ones. Which are which
(`algorithm.options.global_layers`):
    head (default): the classifier head (`head_coordinates`) is global, the body (the feature extractor)
                    local: the mirror image of FedPer, Algorithm 1's local representation under global layers;
    conv:           the convolutional layers are global, every other layer (the fully connected ones, the
                    head among them) local: the authors' CNN split (their CIFAR-10 CNN, num_layers_keep = 2).
Round t, client k:
    start from (local_k, global^t)   [local_k: its own local layers; the initial ones until it is first sampled]
    local SGD on every parameter (train.local_epochs / local_steps), as FedAvg
    send global_k - global^t (weighted); keep local_k in the client-state store (its key "body")
Server: the global layers from the mean update (the server optimizer, GMA's mask as for FedAvg); the
local layers of the global model receive a zero update and stay the initial ones. eval.clients scores
(local_k, global^t). Models with BatchNorm are refused (their running statistics belong to the local
layers but would be averaged as the model's buffers).
"""
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import ConfigError
from .fedper import FedPer

NO_CONV_MODELS = ("mlp", "mclr")  # built-in image models without convolutional layers (and every sequence model)


def conv_coordinates(worker) -> torch.Tensor:
    """Boolean mask over the flat parameters of the model's convolutional layers (nn.Conv1d/2d/3d)."""
    conv = {f"{name}.{p}" for name, module in worker.module.named_modules()
            if isinstance(module, nn.modules.conv._ConvNd) for p, _ in module.named_parameters(recurse=False)}
    mask = torch.zeros(worker.num_params, dtype=torch.bool, device=worker.params.device)
    for name, where in worker.param_slices.items():
        if name in conv:
            mask[where] = True
    return mask


class LGFedAvg(FedPer):
    name = "lgfedavg"
    no_batchnorm = "keeps the body (the feature extractor) per client, whose BatchNorm statistics the server would average"

    @dataclass
    class Options:
        global_layers: str = field(default="head", metadata={"choices": ["head", "conv"]})  # which layers the server averages: head (the classifier head; the body stays local) | conv (the convolutional layers; the fully connected ones, head included, stay local: the authors' CNN split)

    @classmethod
    def check_config(cls, cfg):
        from ..models import SEQUENCE_MODELS

        if cfg.calibration.method != "none":
            raise ConfigError(f"algorithm.name=lgfedavg keeps the body per client; calibration.method="
                              f"{cfg.calibration.method} fits one head on features no client shares: set "
                              "calibration.method=none")
        if cls.read_options(cfg).global_layers == "conv" and cfg.model.name in NO_CONV_MODELS + SEQUENCE_MODELS:
            raise ConfigError(f"algorithm.options.global_layers=conv averages the convolutional layers; model.name="
                              f"{cfg.model.name} has none: use global_layers=head or a convolutional model")

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        if self.options.global_layers == "conv":
            conv = conv_coordinates(worker)
            if not bool(conv.any()):
                raise ConfigError(f"algorithm.options.global_layers=conv averages the convolutional layers; model.name="
                                  f"{cfg.model.name} has none: use global_layers=head or a convolutional model")
            self.local = ~conv
        else:
            self.local = self.body  # FedPer's body: everything but the head
        self.local_index = self.local.nonzero().squeeze(1)

    def load_own_model(self, state, worker):
        if "body" in state:
            worker.params[self.local_index] = state["body"]

    def client_statistics(self, run, worker, stats):
        self.add_update(stats, (worker.params - run.global_params).masked_fill(self.local, 0.0), run.weight)
        stats.add("buffers", worker.buffers, run.weight)
        run.state["body"] = worker.params[self.local_index]  # index tensor indexing copies

"""FedBN (Li, Jiang, Zhang, Kamp and Dou, "FedBN: Federated Learning on Non-IID Features via Local Batch
Normalization", ICLR 2021): BatchNorm parameters and statistics stay with each client
(`aggregation.fedbn: true`), around any method (docs/algorithms/fedbn.md):
  - a client starts from the global model with its own BatchNorm, and `run.global_params` is that
    starting point, so whatever a method builds from it is built against the client's own BatchNorm;
  - the method's moves of the weights (before_forward, after_step) and extra gradient terms
    (correct_gradient) are undone on the BatchNorm coordinates, which train by the plain loss gradient only;
  - the client's BatchNorm is saved into its state after the method's client_statistics;
  - the server's BatchNorm becomes the weighted mean of the cohort's own BatchNorm (parameters and
    statistics), whatever the method's server step did there; only clients never sampled use it.
"""
from __future__ import annotations

import torch
from torch import nn

from ..errors import ConfigError
from ..federation.aggregate import Segment
from ..privacy.rules import DISTRIBUTED
from .feature import Feature


class FedBN(Feature):
    feature_name = "fedbn"
    keys = ("aggregation.fedbn",)
    order = 20
    stateful = True  # each client keeps its own BatchNorm

    @classmethod
    def enabled(cls, cfg) -> bool:
        return bool(cfg.aggregation.fedbn)

    @classmethod
    def refuse(cls, v: dict, method: type) -> None:
        name, mechanism = v["algorithm.name"], v["privacy.mechanism"]
        if not getattr(method, "aggregates", True):
            raise ConfigError(f"algorithm.name={name} aggregates nothing (each client keeps its whole model), so "
                              "aggregation.fedbn has nothing to act on: set aggregation.fedbn=false")
        if method.personalised:
            raise ConfigError(f"algorithm.name={name} keeps a personal model part per client already; aggregation.fedbn "
                              "(personal BatchNorm) does not compose with it: set aggregation.fedbn=false")
        if v["eval.finetune_from"] == "best":
            raise ConfigError("eval.finetune_from=best starts each client's fine-tuning from the best round's global "
                              "model, but aggregation.fedbn gives each client its latest BatchNorm: set "
                              "eval.finetune_from=last (or aggregation.fedbn=false)")
        if mechanism not in ("none", *DISTRIBUTED):
            raise ConfigError(f"privacy.mechanism={mechanism}: aggregation.fedbn averages the clients' own BatchNorm "
                              "layers and statistics outside the clipped update; set aggregation.fedbn=false")
        if v["system.async_mode"] != "none":
            raise ConfigError(f"system.async_mode={v['system.async_mode']} sums weighted updates only: aggregation.fedbn "
                              "is not defined for it; set aggregation.fedbn=false")

    def __init__(self, inner, cfg, setting):
        super().__init__(inner, cfg, setting)
        params, buffers = batchnorm_coordinates(setting.worker, cfg.model.name)
        # The same coordinates as indices, found once: indexing with a boolean mask finds them again each
        # time, which on a GPU waits for the queue. The server step does not set them (`kept_params`).
        self._own(bn_params=params, bn_buffers=buffers, bn_index=params.nonzero().squeeze(1),
                  bn_buffer_index=buffers.nonzero().squeeze(1), kept_params=params)

    # ---- client side ---------------------------------------------------------------------------
    def begin_client(self, run, worker) -> None:
        self._load_batchnorm(run.state, worker)
        run.global_params = worker.params.clone()  # what this client received: its own BatchNorm
        self.inner.begin_client(run, worker)

    def load_own_model(self, state: dict, worker) -> None:
        self.inner.load_own_model(state, worker)
        self._load_batchnorm(state, worker)

    def _load_batchnorm(self, state: dict, worker) -> None:
        """The client's own BatchNorm into the worker (the global one until it has been sampled)."""
        if "bn_params" in state:
            worker.params[self.bn_index] = state["bn_params"]
            worker.buffers[self.bn_buffer_index] = state["bn_buffers"]

    def before_forward(self, w: torch.Tensor, run) -> None:
        own = w[self.bn_index]
        self.inner.before_forward(w, run)
        w[self.bn_index] = own

    def correct_gradient(self, w: torch.Tensor, g: torch.Tensor, run) -> None:
        own = g[self.bn_index]  # the BatchNorm coordinates keep the loss gradient
        self.inner.correct_gradient(w, g, run)
        g[self.bn_index] = own

    def after_step(self, w: torch.Tensor, lr: float, run) -> None:
        own = w[self.bn_index]
        self.inner.after_step(w, lr, run)
        w[self.bn_index] = own

    def added_segments(self) -> list[Segment]:
        return [Segment("bn_params", int(self.bn_index.numel()))]

    def client_statistics(self, run, worker, stats) -> None:
        self.inner.client_statistics(run, worker, stats)
        own = worker.params[self.bn_index]
        stats.add("bn_params", own, run.weight)
        run.state["bn_params"] = own
        run.state["bn_buffers"] = worker.buffers[self.bn_buffer_index]

    # ---- server side ---------------------------------------------------------------------------
    def server_update(self, params: torch.Tensor, buffers: torch.Tensor, reduced) -> None:
        """The method's server step; the global BatchNorm is then the weighted mean of the cohort's own."""
        self.inner.server_update(params, buffers, reduced)
        params[self.bn_index] = reduced["bn_params"].to(params.dtype)


def batchnorm_coordinates(worker, model_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Boolean masks over the flat parameters and buffers that belong to BatchNorm layers (FedBN)."""
    params = torch.zeros(worker.num_params, dtype=torch.bool, device=worker.params.device)
    buffers = torch.zeros(worker.buffers.numel(), dtype=torch.bool, device=worker.params.device)
    found = False
    for name, module in worker.module.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            found = True
            for key in ("weight", "bias"):
                if f"{name}.{key}" in worker.param_slices:
                    params[worker.param_slices[f"{name}.{key}"]] = True
            for key in ("running_mean", "running_var"):
                if f"{name}.{key}" in worker.buffer_slices:
                    buffers[worker.buffer_slices[f"{name}.{key}"]] = True
    if not found:
        raise ConfigError(f"aggregation.fedbn keeps BatchNorm layers local, but model.name={model_name} has "
                          "none; use a BatchNorm model (resnet20, or resnet18 with model.norm=bn)")
    return params, buffers

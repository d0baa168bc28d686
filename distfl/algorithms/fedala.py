"""FedALA (Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedALA: Adaptive Local Aggregation for Personalized
Federated Learning", AAAI 2023), Algorithm 1; docs/algorithms/fedala.md maps it to this file.

Client k keeps its model theta_k from the last round it trained and element-wise weights W_k in [0, 1]
over the top layers (here: the classifier head, `head_coordinates`; the authors' layer_idx = 2 tensors).
At the start of a round, instead of overwriting theta_k with the global model Theta, it initialises
    theta^ = Theta                               on the lower layers
    theta^ = theta_k + (Theta - theta_k) * W_k   on the top layers      (adaptive local aggregation)
learning W_k first on a fraction s of its data: per batch, W_k <- clip[0,1](W_k - eta * grad_theta^ L(theta^) * (Theta - theta_k)).
Each pass records one loss, its last batch's (as the authors' ALA.py). The first time (the start phase)
passes repeat until more than num_pre_loss passes have run and the standard deviation of the last
num_pre_loss recorded losses is below threshold (at most start_passes passes); later rounds take one pass. Then ordinary
local SGD from theta^; the server averages the trained models (FedAvg). A client sampled for the first
time starts from Theta (nothing to aggregate with). eval.clients scores theta^ built from the client's
theta_k and W_k with the current global model (the model it would start its next round from).
The ALA passes run as `run.train(trainable=<nothing>)`: their batches come from the client's stream and
the model's own step is zero; W moves inside `local_loss`.
"""
import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .base import Algorithm
from .model_parts import call_at, flat_views, head_coordinates


class FedALA(Algorithm):
    name = "fedala"
    stateful = True
    personalised = True
    learnable_head = True  # its top layers: the classifier head
    no_batchnorm = "learns its aggregation weights with extra forward passes, each of which would update the running statistics"

    @dataclass
    class Options:
        eta: float = field(default=1.0, metadata={"range": "> 0"})  # step size of W's gradient step (the authors' default 1.0)
        sample_fraction: float = field(default=0.8, metadata={"range": "(0, 1]"})  # the share of the client's samples one ALA pass covers (the authors' rand_percent 80%)
        threshold: float = field(default=0.1, metadata={"range": ">= 0"})  # the start phase ends when the std of the last num_pre_loss passes' losses (each pass's last batch) is below it (0.1)
        num_pre_loss: int = field(default=10, metadata={"range": ">= 1"})  # how many recent passes' losses the start phase's criterion reads; it ends after more than this many passes (the authors' 10)
        start_passes: int = field(default=50, metadata={"range": ">= 1"})  # at most this many ALA passes in the start phase (ours: the authors' loop has no cap)

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.top = head_coordinates(worker, cfg.model.name)
        self.top_index = self.top.nonzero().squeeze(1)
        self.views = flat_views(worker)
        self.nothing = torch.zeros_like(self.top)  # trainable mask of the ALA passes: no coordinate moves
        self.last_loss = torch.tensor(float("nan"))  # the loss of the ALA pass's latest batch

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def _aggregated(self, global_params, state) -> torch.Tensor:
        theta = global_params.clone()
        own = state["theta"][self.top_index]
        theta[self.top_index] = own + (global_params[self.top_index] - own) * state["W"]
        return theta

    def local_training(self, run, worker):
        state = run.state
        if "theta" in state:
            if "W" not in state:
                state["W"] = torch.ones(len(self.top_index), device=self.device)
            steps = math.ceil(run.num_samples * self.options.sample_fraction / self.cfg.train.batch_size)
            passes = 1 if state.get("started") else self.options.start_passes
            pass_losses = []  # one a pass: the loss of its last batch
            for _ in range(passes):
                run.train(steps=steps, trainable=self.nothing, name="ala", record=False)
                pass_losses.append(float(self.last_loss))
                recent = pass_losses[-self.options.num_pre_loss:]
                if len(pass_losses) > self.options.num_pre_loss and float(np.std(recent)) < self.options.threshold:
                    break
            state["started"] = torch.ones((), dtype=torch.bool, device=self.device)
            worker.params.copy_(self._aggregated(run.global_params, state))
        run.train()

    def local_loss(self, model, x, y, run):
        if run.pass_name != "ala":
            return model.loss(model(x), y)
        state, theta_g = run.state, run.global_params
        theta = self._aggregated(theta_g, state).requires_grad_()
        loss = model.loss(call_at(model, self.views, theta, x), y)
        (grad,) = torch.autograd.grad(loss, theta)
        self.last_loss = loss.detach()
        top = self.top_index
        state["W"] = (state["W"] - self.options.eta * grad[top] * (theta_g[top] - state["theta"][top])).clamp(0, 1)
        return sum(p.sum() for p in model.parameters()) * 0.0  # the model's own step in this pass is masked out

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        run.state["theta"] = worker.params.clone()

    def load_evaluated_model(self, run, worker):
        if "theta" in run.state and "W" in run.state:
            worker.params.copy_(self._aggregated(worker.params, run.state))

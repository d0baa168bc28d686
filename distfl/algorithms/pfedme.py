"""pFedMe (T. Dinh, Tran, Nguyen, "Personalized Federated Learning with Moreau Envelopes", NeurIPS 2020),
Algorithm 1; docs/algorithms/pfedme.md maps it to this file.

Client i keeps a local copy w of the global model and a personalised model theta. Each local step, on a
mini-batch D:
    theta ~ argmin_theta f_i(theta; D) + lam/2 ||theta - w||^2, by K steps of gradient descent
            theta <- theta - personal_lr (grad f_i(theta; D) + lam (theta - w))
    w <- w - eta lam (w - theta)
eta is the round's train.lr (the runtime's step, on the loss lam/2 ||w - theta||^2 whose gradient is
lam (w - theta)); theta starts each round at the global model w^t and carries over from step to step (as
the authors' code, whose personalised optimizer steps one persistent model). Server: w^{t+1} =
(1 - beta) w^t + beta mean(w_i), which is the runtime's server step with server.lr = beta (beta = 1:
FedAvg's average). The personalised model of client i (eval.clients) is its theta after the last round
it trained, kept in the client-state store (a client never sampled: the global model). The recorded
train_loss is f_i(theta; D) after the K steps. Models with BatchNorm are refused (the K forward passes a
step would update the running statistics K times).
"""
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError
from .base import Algorithm
from .model_parts import call_at, flat_views


class PFedMe(Algorithm):
    name = "pfedme"
    stateful = True
    personalised = True
    no_batchnorm = "takes K forward passes a step, each of which would update the running statistics"

    @dataclass
    class Options:
        lam: float = field(default=15.0, metadata={"range": "> 0"})  # the Moreau envelope's regularisation lambda (the authors' README's MNIST setting: 15)
        personal_lr: float = field(default=0.09, metadata={"range": "> 0"})  # the step size of the K inner steps on theta (the authors' README's MNIST setting: 0.09)
        steps: int = field(default=5, metadata={"range": ">= 1"})  # K, the inner gradient steps that approximate theta each local step (the paper: 5)

    @classmethod
    def check_config(cls, cfg):
        o = cls.read_options(cfg)
        if o.personal_lr * o.lam >= 2:
            raise ConfigError(f"algorithm.options.personal_lr={o.personal_lr} x algorithm.options.lam={o.lam} >= 2: "
                              "the inner steps on theta diverge (their proximal part multiplies theta - w by "
                              "1 - personal_lr x lam); lower one of them")

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.views = flat_views(worker)
        self.theta = None  # the personalised model of the client training now

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def begin_client(self, run, worker):
        super().begin_client(run, worker)
        self.theta = worker.params.detach().clone()

    def local_loss(self, model, x, y, run):
        o, w = self.options, self.layout.params.detach()
        for _ in range(o.steps):
            theta = self.theta.detach().requires_grad_()
            (grad,) = torch.autograd.grad(model.loss(call_at(model, self.views, theta, x), y), theta)
            self.theta = (theta - o.personal_lr * (grad + o.lam * (theta - w))).detach()
        with torch.no_grad():
            value = model.loss(call_at(model, self.views, self.theta, x), y)
        params = dict(model.named_parameters())
        pull = sum(((params[name] - self.theta[where].view(shape)) ** 2).sum() for name, where, shape in self.views)
        pull = 0.5 * o.lam * pull
        return value + pull - pull.detach()

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        run.state["theta"] = self.theta.clone()

    def load_evaluated_model(self, run, worker):
        if "theta" in run.state:
            worker.params.copy_(run.state["theta"])

"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical Guarantees: A
Model-Agnostic Meta-Learning Approach", NeurIPS 2020), Algorithm 1, first-order (FO) and Hessian-free (HF)
versions; docs/algorithms/perfedavg.md maps it to this file.

Per-FedAvg trains the global model w for the personalised objective F_i(w - alpha grad f_i(w)). Each local
step of client i, on independent mini-batches D, D' (and D'' for HF):
    w~ = w - alpha grad f_i(w; D)
    FO:  w <- w - beta grad f_i(w~; D')
    HF:  w <- w - beta (I - alpha hess f_i(w; D'')) grad f_i(w~; D')
beta is the round's train.lr (the runtime's step, with train.momentum / weight_decay if set). distfl draws
D, D', D'' as the two (FO) or three (HF) parts of the runtime's mini-batch (torch.tensor_split, in the
batch's order); a batch too small to split serves as every part. The Hessian-vector product is exact
(double backward), the quantity the paper's finite difference approximates. The server is FedAvg's.
Personalised model (eval.clients): one step w - alpha grad f_i(w; D) from the global model on one batch of
the client's training data (a `run.train(steps=1)` whose loss is scaled by alpha / lr of the fine-tuning
optimizer, so that its one step, momentum or not, is exactly alpha times the gradient; no weight decay
under eval.finetune_optimizer=own). Models with BatchNorm are refused (three forward passes a step would
update the running statistics three times).
"""
from dataclasses import dataclass, field

import torch
from torch.func import functional_call

from ..federation.client_eval import finetune_train_config
from ..federation.schedule import round_lr
from .base import Algorithm


def batch_parts(x: torch.Tensor, y: torch.Tensor, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The mini-batch as `count` consecutive parts (torch.tensor_split); the whole batch for each part when
    it has fewer samples than parts."""
    if len(y) < count:
        return [(x, y)] * count
    return list(zip(torch.tensor_split(x, count), torch.tensor_split(y, count)))


class PerFedAvg(Algorithm):
    name = "perfedavg"
    personalised = True
    no_batchnorm = "takes two or three forward passes a step, each of which would update the running statistics"

    @dataclass
    class Options:
        alpha: float = field(default=0.01, metadata={"range": ">= 0"})  # the inner (personalisation) step size (FL-bench's default 0.01); beta is train.lr
        variant: str = field(default="fo", metadata={"choices": ["fo", "hf"]})  # fo (first-order) | hf (Hessian-free: the second-order term by a Hessian-vector product)

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.alpha = self.options.alpha
        self.hf = self.options.variant == "hf"

    def evaluated_finetune_epochs(self):
        return None  # one step of size alpha, not epochs (docs/algorithms/perfedavg.md)

    def local_loss(self, model, x, y, run):
        if run.pass_name == "personalise":
            return model.loss(model(x), y) * self._personal_scale(run)
        parts = batch_parts(x, y, 3 if self.hf else 2)
        names, params = zip(*[(n, p) for n, p in model.named_parameters() if p.requires_grad])
        (xa, ya), (xb, yb) = parts[0], parts[1]
        grads = torch.autograd.grad(model.loss(model(xa), ya), params)
        if not self.hf:
            # w~ = w - alpha g with g held fixed: d f(w~; D') / dw = grad f(w~; D')
            tilde = {n: p - self.alpha * g for n, p, g in zip(names, params, grads)}
            return model.loss(functional_call(model, tilde, (xb,)), yb)
        tilde = [(p - self.alpha * g).detach().requires_grad_() for p, g in zip(params, grads)]
        outer = model.loss(functional_call(model, dict(zip(names, tilde)), (xb,)), yb)
        v = torch.autograd.grad(outer, tilde)
        xc, yc = parts[2]
        inner = torch.autograd.grad(model.loss(model(xc), yc), params, create_graph=True)
        hvp = torch.autograd.grad(sum((gi * vi).sum() for gi, vi in zip(inner, v)), params)
        # a loss whose value is the outer loss and whose gradient is v - alpha H v
        direction = [vi - self.alpha * hi for vi, hi in zip(v, hvp)]
        linear = sum((p * d).sum() for p, d in zip(params, direction))
        return outer.detach() + linear - linear.detach()

    def _personal_scale(self, run) -> float:
        train = finetune_train_config(self.cfg)
        return self.alpha / round_lr(train, run.round_idx, train.rounds)

    def load_evaluated_model(self, run, worker):
        run.train(steps=1, name="personalise", record=False)

"""APFL (Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", 2020), Algorithm 1 with the
adaptive mixing weight of its Section 3; docs/algorithms/apfl.md maps it to this file.

Client k keeps a personal model v_k and a mixing weight alpha_k; its personalised model is
    vbar_k = alpha_k v_k + (1 - alpha_k) w.
Each local step, on the same mini-batch xi, from the current (w, v_k, alpha_k):
    w     <- w - lr grad f_k(w; xi)                                   (FedAvg's step, aggregated)
    v_k   <- v_k - lr grad_v f_k(vbar_k; xi) = v_k - lr alpha_k grad f_k(vbar_k; xi)
    alpha_k <- clip[0,1](alpha_k - lr_alpha <v_k - w, grad f_k(vbar_k; xi)>)   (options.adaptive)
w's step is the runtime's (train.* momentum, weight decay); v_k's is plain SGD at the round's lr.
v_k starts from the initial model w^0, alpha_k from algorithm.options.alpha; both live in the
client-state store. eval.clients scores alpha_k v_k + (1 - alpha_k) w^t (the global model for a client
never sampled). Models with BatchNorm are refused (built-in ones at validation, a plugin's when it is built) (vbar would need its own running statistics).
"""
from dataclasses import dataclass, field

import torch
from torch.func import functional_call

from ..federation.schedule import round_lr
from .base import Algorithm


class APFL(Algorithm):
    name = "apfl"
    stateful = True
    personalised = True
    no_batchnorm = "mixes two models parameter by parameter, whose BatchNorm statistics do not mix"

    @dataclass
    class Options:
        alpha: float = field(default=0.5, metadata={"range": "[0, 1]"})  # mixing weight alpha of the personalised model alpha v + (1 - alpha) w (the initial value when adaptive)
        adaptive: bool = True  # learn each client's alpha by a gradient step per local step (the paper's adaptive alpha), clipped to [0, 1]
        alpha_lr: float = field(default=0.01, metadata={"range": ">= 0"})  # with adaptive: step size of alpha's gradient step

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.initial_params = worker.params.detach().clone()
        shapes = {name: p.shape for name, p in worker.module.named_parameters()}
        self.views = [(name, where, shapes[name]) for name, where in worker.param_slices.items()]
        self.alpha_lr = self.options.alpha_lr if self.options.adaptive else 0.0

    def init_client_state(self):
        return {"v": self.initial_params.clone(),
                "alpha": torch.tensor(self.options.alpha, dtype=torch.float32, device=self.device)}

    def _mixed(self, v, w, alpha):
        return alpha * v + (1 - alpha) * w

    def local_loss(self, model, x, y, run):
        w, v, alpha = self.layout.params, run.state["v"], run.state["alpha"]
        mixed = self._mixed(v, w, alpha).detach().requires_grad_()
        tensors = {name: mixed[where].view(shape) for name, where, shape in self.views}
        (grad,) = torch.autograd.grad(model.loss(functional_call(model, tensors, (x,)), y), mixed)
        lr = round_lr(self.cfg.train, run.round_idx, self.cfg.train.rounds)
        if self.alpha_lr:
            run.state["alpha"] = (alpha - self.alpha_lr * torch.dot(v - w.detach(), grad)).clamp(0.0, 1.0)
        run.state["v"] = v - (lr * alpha) * grad  # out of place: the stored state changes only if the client succeeds
        return model.loss(model(x), y)

    def load_evaluated_model(self, run, worker):
        if "v" in run.state:
            worker.params.copy_(self._mixed(run.state["v"], worker.params, run.state["alpha"]))

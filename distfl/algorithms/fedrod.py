"""FedRoD (Chen, Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022), Algorithm 1 with the linear personalised head; docs/algorithms/fedrod.md.

One body phi, two heads on its features z = phi(x): the generic head g (the model's own `head`, shared and
aggregated) and a personal head p_k per client (same shape, kept in the client-state store).
Each local step of client k on (x, y):
    body and generic head: one SGD step on the balanced softmax loss
        L_BSM = CE(g(z) + log n_k, y)          (n_k: the client's class counts; log 0 = -inf)
    personal head: one SGD step (plain, the round's lr) on the empirical risk of the combined logits
        L_P = CE(g(z).detach() + p_k(z.detach()), y)
The server is FedAvg's on the body and the generic head (the generic model: what test_acc scores). The
personalised model (eval.clients) predicts g(z) + p_k(z); both heads are linear on the same z, so it is
the global model with p_k's weight and bias added to the head's. p_k starts at zero (a client never
sampled is scored with the generic model).
"""
import torch
import torch.nn.functional as F

from ..federation.schedule import round_lr
from .base import Algorithm
from .model_parts import head_coordinates


class FedRoD(Algorithm):
    name = "fedrod"
    stateful = True
    personalised = True
    learnable_head = True  # the personal head has the generic head's shape
    cross_entropy = "trains its generic head with a balanced softmax cross-entropy"

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.head_index = head_coordinates(worker, cfg.model.name).nonzero().squeeze(1)
        head = worker.module.head
        self.weight_shape, self.bias_size = tuple(head.weight.shape), head.bias.numel()
        # log n_{k,c}: the balanced softmax's shift of client k's logits (-inf for a class it lacks)
        self.log_counts = torch.as_tensor(population.class_counts, dtype=torch.float32).log().to(device)

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def init_client_state(self):
        return {"phead": torch.zeros(len(self.head_index), device=self.device)}

    def local_loss(self, model, x, y, run):
        z = model.represent(x)
        g = model.head(z)
        phead = run.state["phead"]
        split = self.weight_shape[0] * self.weight_shape[1]
        weight = phead[:split].view(self.weight_shape).detach().requires_grad_()
        bias = phead[split:].detach().requires_grad_()
        personal = model.loss(g.detach() + F.linear(z.detach(), weight, bias), y)
        grad_w, grad_b = torch.autograd.grad(personal, (weight, bias))
        lr = round_lr(self.cfg.train, run.round_idx, self.cfg.train.rounds)
        # out of place: the stored state changes only if the client succeeds
        run.state["phead"] = phead - lr * torch.cat([grad_w.reshape(-1), grad_b])
        return model.loss(g + self.log_counts[run.client_id], y)

    def load_evaluated_model(self, run, worker):
        if "phead" in run.state:
            worker.params[self.head_index] += run.state["phead"]

"""Ditto (Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021), Algorithm 1; docs/algorithms/ditto.md maps it to this file.

Global objective: FedAvg's. Client k also solves its personal objective
    min_v  h_k(v; w*) = F_k(v) + lambda/2 ||v - w*||^2
by local SGD on its own model v_k, each round it is sampled, against the global model it received:
    v_k <- v_k - lr (grad F_k(v_k) + lambda (v_k - w^t))
Round t, client k:  1. w_k = local SGD from w^t (FedAvg's pass, the only one aggregated);
                    2. v_k: the same number of local steps of the proximal objective above.
v_k starts from the initial model w^0 and lives in the client-state store; eval.clients scores v_k
(a client never sampled has none yet and is scored with the global model).
"""
from dataclasses import dataclass, field

from .base import Algorithm


class Ditto(Algorithm):
    name = "ditto"
    stateful = True
    personalised = True

    @dataclass
    class Options:
        lam: float = field(default=0.1, metadata={"range": ">= 0"})  # lambda of the personal objective F_k(v) + lambda/2 ||v - w_global||^2 (paper: tuned from {0.01, 0.1, 1, 2})

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.lam = self.options.lam
        # The worker holds the initial model w^0 while the algorithm is built (also on resume).
        self.initial_params = worker.params.detach().clone()
        self.initial_buffers = worker.buffers.detach().clone()

    def init_client_state(self):
        return {"v": self.initial_params.clone(), "v_buffers": self.initial_buffers.clone()}

    def local_training(self, run, worker):
        # The global pass first, so its batches are FedAvg's: the personal pass continues the stream.
        run.train()
        trained_params, trained_buffers = worker.params.clone(), worker.buffers.clone()
        worker.params.copy_(run.state["v"])
        worker.buffers.copy_(run.state["v_buffers"])
        run.train(name="personal", record=False)
        run.state["v"], run.state["v_buffers"] = worker.params.clone(), worker.buffers.clone()
        worker.params.copy_(trained_params)  # client_statistics aggregates the global pass
        worker.buffers.copy_(trained_buffers)

    def correct_gradient(self, w, g, run):
        if run.pass_name == "personal":
            g.add_(w - run.global_params, alpha=self.lam)

    def load_evaluated_model(self, run, worker):
        if "v" in run.state:
            worker.params.copy_(run.state["v"])
            worker.buffers.copy_(run.state["v_buffers"])

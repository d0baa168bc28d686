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

Stability: the proximal term's explicit step multiplies v - w^t by (1 - lr lambda) (with weight decay,
1 - lr (lambda + wd)); at lr (lambda + wd) >= 2 that factor's size is >= 1 and v_k diverges whatever F_k
is, so such a config is refused before any data loads (config.py). A personal model that still
becomes non-finite (a NaN loss, an lr too large for F_k itself) is counted in the round's
`personal_nonfinite` segment and stops the run as diverged, naming the cause, like a non-finite
global model.
"""
import torch

from ..errors import DivergenceError
from ..federation.aggregate import Segment
from .base import Algorithm


class Ditto(Algorithm):
    name = "ditto"
    stateful = True
    personalised = True

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.lam = cfg.algorithm.ditto_lambda
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

    def segments(self):
        return super().segments() + [Segment("personal_nonfinite", 1, kind="int")]

    def client_statistics(self, run, worker, stats):
        super().client_statistics(run, worker, stats)
        low, high = torch.aminmax(run.state["v"])
        stats.add("personal_nonfinite", ~(torch.isfinite(low) & torch.isfinite(high)))

    def server_update(self, params, buffers, reduced):
        bad = int(reduced["personal_nonfinite"][0])
        if bad:
            raise DivergenceError(
                f"the personal model v_k of {bad} client(s) became non-finite in the round's personal pass "
                f"(algorithm.ditto_lambda={self.lam}, train.lr={self.cfg.train.lr}); lower train.lr or "
                "algorithm.ditto_lambda")
        super().server_update(params, buffers, reduced)

    def correct_gradient(self, w, g, run):
        if run.pass_name == "personal":
            g.add_(w - run.global_params, alpha=self.lam)

    def load_evaluated_model(self, run, worker):
        if "v" in run.state:
            worker.params.copy_(run.state["v"])
            worker.buffers.copy_(run.state["v_buffers"])

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
is, so such a config is refused before any data loads (`check_config`). A personal model that still
becomes non-finite (a NaN loss, an lr too large for F_k itself) is counted in the round's
`personal_nonfinite` segment and stops the run as diverged, naming the cause, like a non-finite
global model.
"""
from dataclasses import dataclass, field

import torch

from ..errors import ConfigError, DivergenceError
from ..federation.aggregate import Segment
from ..federation.schedule import round_lr
from .base import Algorithm


class Ditto(Algorithm):
    name = "ditto"
    stateful = True
    personalised = True

    @dataclass
    class Options:
        lam: float = field(default=0.1, metadata={"range": ">= 0"})  # lambda of the personal objective F_k(v) + lambda/2 ||v - w_global||^2 (paper: tuned from {0.01, 0.1, 1, 2})

    @classmethod
    def check_config(cls, cfg):
        """The personal pass steps v <- v - lr (grad F(v) + (lambda + wd) v - lambda w): its quadratic part
        alone multiplies v - w by 1 - lr (lambda + wd), which diverges once lr (lambda + wd) >= 2."""
        lr = max(round_lr(cfg.train, t, cfg.train.rounds) for t in range(1, cfg.train.rounds + 1))
        lam, wd = cls.read_options(cfg).lam, cfg.train.weight_decay
        if lr * (lam + wd) >= 2:
            raise ConfigError(f"algorithm.options.lam={lam} with train.lr={lr} (the largest lr of the schedule) and "
                              f"train.weight_decay={wd}: the personal pass's proximal step diverges once lr x (lam "
                              f"+ weight_decay) >= 2 (here {lr * (lam + wd):g}); lower train.lr or algorithm.options.lam "
                              "so that their product is below 2")

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
                f"(algorithm.options.lam={self.lam}, train.lr={self.cfg.train.lr}); lower train.lr or "
                "algorithm.options.lam")
        super().server_update(params, buffers, reduced)

    def correct_gradient(self, w, g, run):
        if run.pass_name == "personal":
            g.add_(w - run.global_params, alpha=self.lam)

    def load_evaluated_model(self, run, worker):
        if "v" in run.state:
            worker.params.copy_(run.state["v"])
            worker.buffers.copy_(run.state["v_buffers"])

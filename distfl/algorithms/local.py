"""Local-only training: the first row of every personalised-FL table (FedRep's, FedBABU's, PFLlib's
"Local"). docs/algorithms/local.md.

Each client trains its own model v_k on its own data and never communicates it. Round t, client k
(when sampled):
    v_k <- local SGD of v_k on its own batches (train.local_epochs / local_steps, train.* optimizer)
v_k starts from the initial model w^0, the same for every client (the run's seed), and lives in the
client-state store with its float buffers (BatchNorm statistics). Nothing is aggregated: the round's
all_reduce carries only the runtime's counts (no delta or buffers segment), and the global model stays
w^0. eval.clients scores v_k; a client never sampled is scored with w^0 (the untrained model).
The cost per sampled client is FedAvg's: one pass of local training, no second model.
"""
from ..errors import ConfigError
from .base import Algorithm


class LocalOnly(Algorithm):
    name = "local"
    stateful = True
    personalised = True
    aggregates = False  # nothing of a client's model is summed: the features that act on the sum refuse it

    @classmethod
    def check_config(cls, cfg):
        if cfg.calibration.method != "none":
            raise ConfigError(f"algorithm.name={cls.name} aggregates nothing (each client keeps its whole model), so "
                              "calibration.method has nothing to act on: set calibration.method=none")

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        # The worker holds the initial model w^0 while the algorithm is built (also on resume: the
        # global model never moves, so it is w^0 then too).
        self.initial_params = worker.params.detach().clone()
        self.initial_buffers = worker.buffers.detach().clone()

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def init_client_state(self):
        return {"v": self.initial_params.clone(), "v_buffers": self.initial_buffers.clone()}

    def load_own_model(self, state, worker):
        if "v" in state:
            worker.params.copy_(state["v"])
            worker.buffers.copy_(state["v_buffers"])

    def segments(self):
        return []

    def client_statistics(self, run, worker, stats):
        run.state["v"], run.state["v_buffers"] = worker.params.clone(), worker.buffers.clone()

    def server_update(self, params, buffers, reduced):
        pass

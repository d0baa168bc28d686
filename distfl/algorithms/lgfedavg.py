"""LG-FedAvg (Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency, "Think Locally, Act
Globally: Federated Learning with Local and Global Representations", 2020), Algorithm 1;
docs/algorithms/lgfedavg.md maps it to this file.

The mirror image of FedPer: each client keeps its own LOCAL representation (the body, the feature
extractor) and the server averages only the GLOBAL layers (the classifier head, `head_coordinates`).
Round t, client k:
    start from (body_k, head^t)   [body_k: its own body; the initial body until it is first sampled]
    local SGD on every parameter (train.local_epochs / local_steps), as FedAvg
    send head_k - head^t (weighted); keep body_k in the client-state store
Server: head^{t+1} from the mean head update (the server optimizer, GMA's mask as for FedAvg); the global
body receives a zero update and stays the initial one. eval.clients scores (body_k, head^t).
Models with BatchNorm are refused (their running statistics belong to the local body but would be
averaged as the model's buffers).
"""
from ..errors import ConfigError
from .fedper import FedPer


class LGFedAvg(FedPer):
    name = "lgfedavg"
    no_batchnorm = "keeps the body (the feature extractor) per client, whose BatchNorm statistics the server would average"

    @classmethod
    def check_config(cls, cfg):
        if cfg.calibration.method != "none":
            raise ConfigError(f"algorithm.name=lgfedavg keeps the body per client; calibration.method="
                              f"{cfg.calibration.method} fits one head on features no client shares: set "
                              "calibration.method=none")

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.body_index = self.body.nonzero().squeeze(1)

    def load_own_model(self, state, worker):
        if "body" in state:
            worker.params[self.body_index] = state["body"]

    def client_statistics(self, run, worker, stats):
        self.add_update(stats, (worker.params - run.global_params).masked_fill(self.body, 0.0), run.weight)
        stats.add("buffers", worker.buffers, run.weight)
        run.state["body"] = worker.params[self.body_index]  # index tensor indexing copies

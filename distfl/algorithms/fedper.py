"""FedPer (Arivazhagan, Aggarwal, Singh, Choudhary, "Federated Learning with Personalization Layers",
2019); docs/algorithms/fedper.md maps it to this file.

The model is base layers (shared, aggregated by FedAvg) and personalisation layers (kept by each
client). distfl's split is the model's classifier head (`head_coordinates`: the `head` module of a
`distfl.Classifier`) as the personal layer, the feature extractor as the base. Round t, client k:
    start from (body^t, head_k)  [head_k: its own head; the initial head until it is first sampled]
    local SGD on every parameter (train.local_epochs / local_steps), as FedAvg
    send body_k - body^t (weighted); keep head_k in the client-state store
Server: body^{t+1} from the mean body update (the server optimizer, GMA's mask as for FedAvg); the
global head receives a zero update, so it stays the initial head. eval.clients scores (body^t, head_k).
"""
from .base import Algorithm
from .model_parts import head_coordinates


class FedPer(Algorithm):
    name = "fedper"
    stateful = True
    personalised = True
    head_split = True

    def evaluated_finetune_epochs(self) -> int:
        return 0

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.head = head_coordinates(worker, cfg.model.name)
        self.body = ~self.head
        # The head as indices, found once: boolean-mask indexing finds them again each time, which on a
        # GPU waits for the queue (as FedBN's bn_index).
        self.head_index = self.head.nonzero().squeeze(1)

    def load_own_model(self, state, worker):
        if "head" in state:
            worker.params[self.head_index] = state["head"]

    def client_statistics(self, run, worker, stats):
        self.add_update(stats, (worker.params - run.global_params).masked_fill(self.head, 0.0), run.weight)
        stats.add("buffers", worker.buffers, run.weight)
        run.state["head"] = worker.params[self.head_index]  # index tensor indexing copies

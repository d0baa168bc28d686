"""FedBABU (Oh, Kim, Yun, "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022), Algorithm 1; docs/algorithms/fedbabu.md maps it to this file.

Training: the head (the classifier, `head_coordinates`) stays at its random initialisation; only the
body is trained locally (head frozen: no gradient step, no weight decay, no momentum on it) and
aggregated, as FedAvg. The global model is (body^t, head^0).
Evaluation (eval.clients): each client fine-tunes the whole global model on its own training data
for algorithm.finetune_epochs epochs (paper: 5) of local SGD (train.batch_size, the lr of the last
round, train.momentum and weight_decay), then is scored. Nothing is kept per client.
"""
from .base import Algorithm, head_coordinates


class FedBABU(Algorithm):
    name = "fedbabu"
    personalised = True

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.head = head_coordinates(worker, cfg.model.name)
        self.body = ~self.head

    def local_training(self, run, worker):
        run.train(trainable=self.body)

    def evaluated_finetune_epochs(self) -> int:
        return self.cfg.algorithm.finetune_epochs

    def load_evaluated_model(self, run, worker):
        if self.cfg.algorithm.finetune_epochs:
            run.train(epochs=self.cfg.algorithm.finetune_epochs, name="finetune")

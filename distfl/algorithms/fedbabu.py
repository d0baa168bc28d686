"""FedBABU (Oh, Kim, Yun, "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022), Algorithm 1; docs/algorithms/fedbabu.md maps it to this file.

Training: the head (the classifier, `head_coordinates`) stays at its random initialisation; only the
body is trained locally (head frozen: no gradient step, no weight decay, no momentum on it) and
aggregated, as FedAvg. The global model is (body^t, head^0).
Evaluation (eval.clients): each client fine-tunes the whole global model on its own training data
for algorithm.options.finetune_epochs epochs (paper: 5) of local SGD (train.batch_size, the lr of the last
round, train.momentum and weight_decay), then is scored. Nothing is kept per client.
"""
from dataclasses import dataclass, field

from ..errors import ConfigError
from .base import Algorithm
from .model_parts import head_coordinates


class FedBABU(Algorithm):
    name = "fedbabu"
    personalised = True
    head_split = True

    @dataclass
    class Options:
        finetune_epochs: int = field(default=5, metadata={"range": ">= 0"})  # epochs each client fine-tunes the whole global model on its training data before it is scored (eval.clients; paper: 5), with the optimizer of eval.finetune_optimizer

    @classmethod
    def check_config(cls, cfg):
        if cfg.eval.finetune_epochs and cfg.eval.clients:
            raise ConfigError(f"eval.finetune_epochs={cfg.eval.finetune_epochs} fine-tunes the global model, but "
                              "algorithm.name=fedbabu is personalised: each client is scored with its own model (its own "
                              "fine-tuning: algorithm.options.finetune_epochs); set eval.finetune_epochs=0")

    def __init__(self, cfg, population, worker, device, model_factory=None):
        super().__init__(cfg, population, worker, device, model_factory)
        self.head = head_coordinates(worker, cfg.model.name)
        self.body = ~self.head

    def local_training(self, run, worker):
        run.train(trainable=self.body)

    def evaluated_finetune_epochs(self) -> int:
        return self.options.finetune_epochs

    def load_evaluated_model(self, run, worker):
        if self.options.finetune_epochs:
            run.train(epochs=self.options.finetune_epochs, name="finetune")

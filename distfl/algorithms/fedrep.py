"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized
Federated Learning", ICML 2021), Algorithm 1; docs/algorithms/fedrep.md maps it to this file.

Shared representation phi (the body), personal head h_k (the classifier head, `head_coordinates`).
Round t, client k:
    h_k <- tau_h local epochs of SGD on h_k, body frozen at phi^t     (algorithm.options.head_epochs, paper 10)
    phi_k <- tau_phi local epochs of SGD on phi, head frozen at the new h_k  (options.body_epochs, paper 1)
    send phi_k - phi^t (weighted); keep h_k in the client-state store
Server: phi^{t+1} from the mean body update (as FedPer); the global head stays the initial one.
The batches of both passes continue the client's keyed stream; momentum restarts with each pass.
"""
from dataclasses import dataclass, field

from ..errors import ConfigError
from ..federation.local import samples_trained
from .fedper import FedPer


class FedRep(FedPer):
    name = "fedrep"

    @dataclass
    class Options:
        head_epochs: int = field(default=10, metadata={"range": ">= 0"})  # local epochs of the personal head (body frozen) each round, before the body's (paper: 10)
        body_epochs: int = field(default=1, metadata={"range": ">= 0"})  # local epochs of the shared body (head frozen) after the head's (paper: 1); fedrep takes its epochs from these two options, not train.local_epochs

    @classmethod
    def check_config(cls, cfg):
        options = cls.read_options(cfg)
        if cfg.train.local_steps or cfg.train.local_epochs != 1:
            raise ConfigError("algorithm.name=fedrep trains algorithm.options.head_epochs epochs of the head, then "
                              "algorithm.options.body_epochs of the body; set those (and train.local_epochs=1, "
                              "train.local_steps=0)")
        if options.head_epochs + options.body_epochs == 0:
            raise ConfigError("algorithm.name=fedrep with algorithm.options.head_epochs=0 and body_epochs=0 trains "
                              "nothing; set one of them >= 1")

    def local_training(self, run, worker):
        epochs = self.options
        if epochs.head_epochs:
            run.train(epochs=epochs.head_epochs, trainable=self.head, name="head")
        if epochs.body_epochs:
            run.train(epochs=epochs.body_epochs, trainable=self.body, name="body")

    def local_samples(self, num_samples, train_cfg):
        epochs = self.options.head_epochs + self.options.body_epochs
        return samples_trained(num_samples, train_cfg.batch_size, epochs, fold_single=self.layout.fold_single)

"""FedRep (Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations for Personalized
Federated Learning", ICML 2021), Algorithm 1; docs/algorithms/fedrep.md maps it to this file.

Shared representation phi (the body), personal head h_k (the classifier head, `head_coordinates`).
Round t, client k:
    h_k <- tau_h local epochs of SGD on h_k, body frozen at phi^t     (algorithm.head_epochs, paper 10)
    phi_k <- tau_phi local epochs of SGD on phi, head frozen at the new h_k  (algorithm.body_epochs, paper 1)
    send phi_k - phi^t (weighted); keep h_k in the client-state store
Server: phi^{t+1} from the mean body update (as FedPer); the global head stays the initial one.
The batches of both passes continue the client's keyed stream; momentum restarts with each pass.
"""
from ..federation.local import samples_trained
from .fedper import FedPer


class FedRep(FedPer):
    name = "fedrep"

    def local_training(self, run, worker):
        epochs = self.cfg.algorithm
        if epochs.head_epochs:
            run.train(epochs=epochs.head_epochs, trainable=self.head, name="head")
        if epochs.body_epochs:
            run.train(epochs=epochs.body_epochs, trainable=self.body, name="body")

    def local_samples(self, num_samples, train_cfg):
        epochs = self.cfg.algorithm.head_epochs + self.cfg.algorithm.body_epochs
        return samples_trained(num_samples, train_cfg.batch_size, epochs, fold_single=self.layout.fold_single)
